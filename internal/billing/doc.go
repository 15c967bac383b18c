// Package billing turns durable usage into bills: it closes billing periods into
// immutable usage and billing rows (Closer, run by the River jobs of
// internal/worker), streams billing exports in CSV and JSON, and answers the usage,
// would-block and adjustment API (Service), reading the ledger (internal/ledger) and,
// for the current period, the live counters in Redis.
//
// # Usage pages
//
// `GET /v1/orgs/{org}/usage` answered every user of the period in one document and read
// each counter's sliding windows with a cost-0 check (22,483 users: 3.97 MB in 0.75 s).
// Users now come a page at a time (`limit`, default 100, at most 1,000; `cursor`;
// `next_cursor` absent on the last page), ordered by team and id, each with its rows of
// every metric; the org and its teams are on every page (`billing.pageUsers`). The page
// is cut before the sliding windows are read, so a page costs one script run per counter
// of the org, its teams and the page's users, whatever the org's users. The month
// counters are still read whole (one `HGETALL`, and the ledger's rows): bounded by
// `QUOTA_UNREGISTERED_USERS` ("Shared Redis bounds" above). The response only gains
// `next_cursor`; the console (`web/src/api.ts`) follows it, 1,000 users a request, since
// its overview and allocation show every user. Test: internal/httpapi
// `TestUsagePagesOverUsers` (250 users in pages of 100, ordered, each once; a page of 2
// runs a few scripts, not 252; bad limits and cursors 400).
package billing
