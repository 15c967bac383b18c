// Package archtest keeps the import rules of docs/ARCHITECTURE.md. Its test lists every
// package of the module with `go list -json ./...` and checks each one's imports (its
// own build, not its tests') against one explicit table of layers, from the binaries
// down to the shared vocabulary:
//
//	cmd        cmd/api, cmd/worker, cmd/loadgen, cmd/scale
//	transport  httpapi, rls, console, worker, demo
//	service    checks
//	domain     tenants, quota, ledger, billing, webhooks
//	base       vocab, derrors, config, platform/*
//
// A package may import its own layer and the layers below it, never one above, and a
// few rules narrow that: tenants does not import quota, quota and tenants import none of
// ledger, billing and webhooks, the transports httpapi and rls import no engine package
// (quota), and vocab imports nothing internal but derrors. The
// test-only packages (clienttest, faulttest, leasetest, readmetest, clustertest,
// loadgen, scale, archtest) stand outside the layers: their own imports are free, and only
// the binaries and other test-only packages may import them. A package the table does
// not place fails the test, so a new package gets a place, and a reason, when it is
// added.
//
// It is a plain Go test: `make test` runs it, and `make lint` runs it on its own.
//
// # The import rules
//
// `internal/archtest` (`TestImportRules`, in `make lint` and `make test`) lists the
// module's packages with `go list -json ./...` and checks every import of each one's own
// build (tests may import what they test with) against one table of layers, the "Map"
// above: cmd, transport, service, domain, base, plus the test-only packages and the ones
// outside `cmd/` and `internal/`. A package imports its own layer and those below; on top
// of that, `tenants` does not import `quota`, `quota` and `tenants` import none of
// `ledger`, `billing` and `webhooks`, `httpapi` and `rls` import no engine package
// (`quota`), `vocab` imports nothing internal but `derrors`, and
// only the binaries and the test-only packages import a test-only package. A package the
// table does not place fails the test. Breaks that a planned step removes are
// listed in its `pending` table, each with the step: its rule's subtest skips while they
// last, and a pending entry that no longer happens fails the test until it is deleted.
// `TestRulesRefuse` checks that the rules refuse what they should.
package archtest
