# Quotaplane. `make help` lists the targets.
SHELL := /bin/bash
GO    ?= go

.PHONY: help run build test test-alerts test-client test-k8s test-rules test-sdk test-python test-short generate check-generate lint bench bench-orgs bench-users web web-check test-web test-e2e test-cluster fuzz test-faults faults scale

help: ## list the targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-15s %s\n", $$1, $$2}'

run: ## build and start api + worker on local Postgres and Redis, with a demo org and printed keys
	@bash scripts/run.sh

build: ## build bin/quotaplane-api and bin/quotaplane-worker
	$(GO) build -o bin/quotaplane-api ./cmd/api
	$(GO) build -o bin/quotaplane-worker ./cmd/worker

FAULT_TESTS := TestRedisKilledUnderLoad|TestRedisPausedUnderLoad|TestPostgresStoppedFor30s|TestFaultSchedule|TestWorkerKilledMidFlushLosesNothing|TestReservationExpiresAfterRedisRestart
# Timed against a real Prometheus: run alone (test-alerts), not beside every package's tests.
ALERT_TESTS := TestAlertsFireAndResolve

test: ## run every test: Go under -race against real Postgres and Redis, the Prometheus rules, the alerts in a real Prometheus, the fault tests, the Kubernetes manifests, the TypeScript and Python clients', then the console's (Vitest, Chromium)
	$(GO) test -race -count=1 -timeout 15m -skip '^($(FAULT_TESTS)|$(ALERT_TESTS))$$' ./...
	$(GO) test -count=1 -run 'AddsNoAllocations' ./internal/quota # allocation counts, which -race changes
	@$(MAKE) --no-print-directory test-client test-rules test-alerts test-faults test-k8s test-sdk test-python test-web web-check test-e2e

test-client: ## the Go client module's own tests (client/, standard library only; its tests against the real api are internal/clienttest, in test)
	cd client && $(GO) test -race -count=1 ./...

test-k8s: ## decode deploy/k8s strictly into the Kubernetes API types and check probes, ports, selectors and variables (its own Go module)
	cd deploy/k8s && $(GO) test -count=1 ./...

test-rules: ## check and unit-test the Prometheus rules of deploy/prometheus with promtool (skipped without it unless CI=true)
	@if ! command -v promtool >/dev/null 2>&1; then \
	  if [ "$$CI" = true ]; then echo "promtool is missing: apt-get install prometheus"; exit 1; fi; \
	  echo "promtool not found: skipping the Prometheus rule tests (apt-get install prometheus)"; exit 0; \
	fi; \
	promtool check rules deploy/prometheus/*.rules.yml && promtool test rules deploy/prometheus/tests/*.yml

test-alerts: ## the shipped alerts in a real Prometheus (Debian's prometheus binary, skipped without it unless CI=true) against a real api and worker, faults injected one at a time, and every dashboard expression evaluated (~2.5 min)
	$(GO) test -count=1 -timeout 8m -v -run '^($(ALERT_TESTS))$$' ./internal/alerttest/

test-faults: ## the fault tests (Redis killed and paused under load, Postgres stopped for 30 s, the short fault schedule of internal/faulttest), one package at a time, printing their figures
	$(GO) test -race -count=1 -timeout 10m -v -run '^($(FAULT_TESTS))$$' ./internal/quota/ ./internal/httpapi/ ./internal/faulttest/

SEED     ?= $(shell date +%s)
DURATION ?= 10m
RACE     ?= 1
faults: ## the fault schedule for DURATION (default 10m) from SEED (default: the time), binaries under -race (RACE=0: not): 3 api replicas, worker, private Redis; kills, restarts, cuts, clock steps; the oracle's table per limit
	FAULTS_SEED=$(SEED) FAULTS_DURATION=$(DURATION) FAULTS_RACE_BINARIES=$(RACE) $(GO) test -race -count=1 -timeout 60m -v -run '^TestFaultSchedule$$' ./internal/faulttest/

web/node_modules: web/package-lock.json
	cd web && npm ci --no-audit --no-fund
	@touch web/node_modules

web: web/node_modules ## rebuild the console into web/dist (embedded in quotaplane-api; commit it)
	cd web && npm run build

web-check: web/node_modules ## fail when the committed web/dist differs from a fresh build of web/src
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	  (cd web && npx tsc --noEmit -p . && npx vite build --logLevel warn --outDir "$$tmp/dist" --emptyOutDir) && \
	  diff -r web/dist "$$tmp/dist" >/dev/null || { echo "web/dist is stale: run make web and commit web/dist"; exit 1; }

test-web: web/node_modules ## the console's unit tests (Vitest)
	cd web && npx vitest run

test-e2e: ## the console's end-to-end tests in headless Chromium against a real quotaplane-api
	@bash scripts/e2e.sh

test-short: ## the tests without the slow ones (no code generation drift check)
	$(GO) test -short -count=1 ./...

sdk/typescript/node_modules: sdk/typescript/package-lock.json
	cd sdk/typescript && npm ci --no-audit --no-fund
	@touch sdk/typescript/node_modules

test-sdk: sdk/typescript/node_modules ## the TypeScript client's tests (node's test runner) against a real quotaplane-api and worker built from this checkout
	cd sdk/typescript && npm test

# Debian's python3 with python3-httpx, -pytest and -pytest-asyncio (.ci/run installs them).
PYTHON ?= /usr/bin/python3
test-python: ## the Python client's tests (pytest) against a real quotaplane-api and worker built from this checkout, its README's examples and install commands (PYTHON=/usr/bin/python3)
	cd sdk/python && $(PYTHON) -m pytest -q

generate: sdk/typescript/node_modules ## regenerate the API types from api/openapi.yaml: Go (internal/httpapi/api) and TypeScript (sdk/typescript/src/schema.d.ts, also used by web/); and deploy/k8s/prometheusrule.yaml from the rules file
	$(GO) tool oapi-codegen -config api/oapi-codegen.yaml api/openapi.yaml
	cd sdk/typescript && npx openapi-typescript ../../api/openapi.yaml -o src/schema.d.ts --silent
	cd deploy/k8s && QUOTAPLANE_UPDATE_RULES=1 $(GO) test -count=1 -run TestPrometheusRuleIsTheRulesFile ./... >/dev/null

check-generate: generate ## fail when the generated code differs from what is committed
	@git diff --exit-code -- internal/httpapi/api sdk/typescript/src/schema.d.ts deploy/k8s/prometheusrule.yaml || { echo "generated code is stale: run make generate and commit"; exit 1; }

lint: ## gofmt, go vet (the client's and deploy/k8s's modules too), no error status chosen outside internal/platform/problem, no gRPC code outside internal/rls/status.go, and the import rules (internal/archtest)
	@out=$$(gofmt -l cmd internal migrations scripts webhook deploy client examples); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	cd client && $(GO) vet ./...
	cd deploy/k8s && $(GO) vet ./...
	$(GO) test -count=1 -run TestNoStatusOutsideTheMap ./internal/platform/problem/
	$(GO) test -count=1 -run TestNoCodeOutsideTheMap ./internal/rls/
	$(GO) test -count=1 ./internal/archtest/

bench: ## benchmark the check engine, /v1/check over HTTP and ShouldRateLimit over gRPC, 2-metric checks and acquire+release pairs, then bench-users; prints summary tables
	@bash scripts/bench.sh

SCALE_ORGS ?= 100000
SCALE_API_ORGS ?= 100000
scale: ## 100,000 orgs, each figure against its bound: the worker (a tick's writes with every org active, the ledger then equal to the counters; a restart's first flush; idle ticks) and the api (checks spread over every org against 10 after a warm pass; RSS); SCALE_ORGS=2000,100000 for more runs (~10 min; its short version in make test is TestScaleShort)
	@status=0; \
	  $(GO) run ./cmd/scale -orgs $(SCALE_ORGS) || status=1; \
	  BENCH_ORGS=$(SCALE_API_ORGS) bash scripts/bench_orgs.sh || status=1; \
	  exit $$status

bench-orgs: ## checks spread over 3,000 and 10,000 orgs against the same load over 10: checks/s ratios, Postgres transactions per check, PASS/FAIL (~4 min; not in make test)
	@bash scripts/bench_orgs.sh

bench-users: ## checks over 1,000,000 distinct user ids vs 1,000 repeating: Postgres queries per check, checks/s, RSS (~1.7 min)
	@bash scripts/bench_users.sh

test-cluster: ## the Redis Cluster suite: 6 redis-server nodes, 3 api replicas and a worker; a primary killed mid-load
	QUOTA_CLUSTER_TEST=1 $(GO) test -count=1 -timeout 10m -v -run 'TestCluster' ./internal/clustertest/

FUZZTIME ?= 30s
fuzz: ## run every Go fuzz target for FUZZTIME each (default 30s) and print execs per target
	@FUZZTIME=$(FUZZTIME) bash scripts/fuzz.sh
