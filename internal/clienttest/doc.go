// Package clienttest tests the Go client module (client/, a module of its own that
// cannot import this one's internal packages) against the real quotaplane-api and
// quotaplane-worker, started by testenv.StartStack on a fresh database: checks and
// their headers, a lost reply retried, Quotaplane down under each fail policy, the
// net/http middleware with the standard mux and chi (every option of issue 31, an
// unregistered user answered 403, a streaming disconnect that still counts what the
// handler reported), the caller's cancel, reservations, webhook
// verification of the worker's real deliveries, and the tour's Go client steps
// followed as printed in a fresh directory outside the repository (a new module that
// replaces the client by the clone's client/). The package has only tests.
package clienttest
