// Package clienttest tests the Go client module (client/, a module of its own that
// cannot import this one's internal packages) against the real quotaplane-api and
// quotaplane-worker, started by testenv.StartStack on a fresh database: checks and
// their headers, a lost reply retried, Quotaplane down under each fail policy, the
// net/http middleware with the standard mux and chi, reservations, webhook
// verification of the worker's real deliveries, and a fresh module outside the
// repository built against client/ alone. The package has only tests.
package clienttest
