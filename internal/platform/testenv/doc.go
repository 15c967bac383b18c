// Package testenv gives tests real Postgres and Redis: a fresh migrated database per
// call, and the shared Redis with unique ids so tests never see each other's keys.
//
// Where they come from, in order: DATABASE_URL / REDIS_URL when set; the local
// servers at their default addresses when they answer; otherwise containers started
// with testcontainers-go (contributors with Docker). When none of these is available a
// test is skipped, except under CI=true, where it fails.
//
// StartStack runs the real quotaplane-api and quotaplane-worker for the tests that
// need the binaries themselves (the README test, the deploy test), and RepoRoot finds
// the repository's files.
//
// # Tests
//
// `internal/platform/testenv` hands each test a fresh database cloned from a migrated
// template (`qp_tpl_<hash of the migrations>`, built once under an advisory lock and
// reused while the migrations are unchanged), dropped at cleanup. Redis is shared: tests
// use their own ids or key prefixes and never flush it. Under `CI=true` a missing
// Postgres or Redis fails the test instead of skipping it.
//
// `testenv.StartStack` is the one harness of the tests that run the real binaries (the
// README test, the deploy test): it builds `quotaplane-api` and `quotaplane-worker` once
// per test process (the package's `TestMain` calls `testenv.Main`, which removes them),
// seeds the demo org on a fresh database, owns the Redis database it is given (flushed
// first, one run at a time under a Postgres advisory lock), starts both on free ports
// without the developer's `QUOTA_*` settings and waits for `/readyz`. `testenv.RepoRoot`
// finds the repository's files (README.md, api/openapi.yaml, deploy/) from any test.
// `testenv.Proc` is the one child process of the fault schedule and the alert suite: started,
// stopped, killed -9 and started again with the same command line, killed with the test
// process (Pdeathsig), its last 32 KiB of output and its `-race` reports kept (`testenv.Tail`).
//
// The deploy test (`deploy/deploy_test.go`) builds both binaries, runs them on a fresh
// database and on Redis database 14 (flushed first, one run at a time under an advisory
// lock, as the README test does with database 15), makes an allowed, a denied and a
// batch check, waits for a flush and scrapes both `/metrics`; every metric that a query of
// `deploy/grafana/*.json` or an expression of `deploy/prometheus/*.rules.yml` selects
// (parsed with Prometheus's own PromQL parser) must be among them, a histogram's
// `_bucket`, `_sum` and `_count` included, or be a recording rule. Two families appear
// only in circumstances it does not create (cluster re-sends, cache evictions); they are
// listed, and must still be declared in the Go source.
//
// # Fuzzing
//
// `scripts/fuzz.sh` (`make fuzz`) runs every `Fuzz` target of the module (found with
// `go test -list '^Fuzz' ./...`) for `FUZZTIME` (30s) each and prints execs and
// execs/s per target; a failure leaves its input in the package's `testdata/fuzz/`, to
// commit as a regression case (plain `go test` runs the seed corpus and those files).
// Go 1.26's fuzzing coordinator can end a clean run with a bare "context deadline
// exceeded" at the `-fuzztime` boundary (golang/go#75804, fixed in Go 1.27): a target
// that fails that way with no input written runs once more, and the summary says so;
// the race twice in a row, or any failure with an input, fails
// (`scripts.TestFuzzRunsAgainOnlyAfterGosDeadlineRace`).
//
//   - `tenants.FuzzParseToken`: whatever the key parser accepts has exactly the generated
//     shape `qpk_<16 lower-case hex>_<43 base64url, last 2 bits zero>` and yields the id in
//     it; the token of any id and secret parses back to its id.
//   - `httpapi.FuzzDecodeCheckBodyLikeTheContract`: the check routes' decoders (hand-written
//     fast path, `decodeStrict` fallback) and the reservation and extend decoders accept
//     exactly what the contract's reference accepts (`referenceDecode`: `encoding/json`,
//     one strict value, and by reflection every key of the request's own objects, at any
//     level, exactly a declared json tag; a map's keys are the caller's), decode it as
//     `encoding/json` does, and refuse the rest with a 400 that names what is at fault in
//     `errors[]` and holds no trace of Go (`json:`, `Go struct`, type names).
//     `FuzzCheckRequestParsersAgreeWithTheContract` checks the fast path alone.
//   - `quota.FuzzCheckKeysShareOneSlot`: every key a check touches, the script's KEYS and
//     the window buckets the engine names in ARGV (`quota.CheckKeys` in export_test.go
//     reads them from the command `quota.CheckCommand` builds), has the org as its hash tag and so one Redis Cluster slot (CRC16-XMODEM mod 16384, checked
//     against the spec's vector and `CLUSTER KEYSLOT`); a prefix or org id with a brace is
//     refused (`Config.KeyPrefix` may not contain `{`, `}` or `|`; ids never do).
package testenv
