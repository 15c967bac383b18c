// Package readmetest runs README.md and docs/TOUR.md (the tour of the API) as a test
// (readme_test.go): every shell command of their ```sh blocks that talks to the API,
// the README's and then the tour's, in page order, exactly as printed, against one
// freshly built quotaplane-api and quotaplane-worker on a fresh database with the demo
// org that `make run` seeds, as a reader runs them on one `make run`: the tour's
// answers are those that come after the README's commands. Each answer is checked
// against what the page shows for the command, so neither page can drift from the
// service. A new page of examples is one entry in readme_test.go's pages.
//
// How an example is read (README below stands for either page):
//
//   - A command talks to the API when it names localhost:8080 (or 127.0.0.1:8080),
//     which the test rewrites to its own address; other commands (make run) are not run.
//     A command continues over lines while a quote is open or a line ends with '\'.
//   - `NAME=...` lines are placeholders the test fills: OP is the operator token and
//     KEY the demo org key. A placeholder the test does not know fails it.
//   - A command's expected answer is either the `# ` comment lines right under it (no
//     blank line between), or, for the last command of a block, a fenced block that
//     follows the ```sh block with only blank lines between.
//   - An answer that starts with a status line (`HTTP/1.1 200 OK`, curl -i) is
//     compared on that line, on the headers shown (others may be present) and on the
//     body. A body is compared structurally when it is JSON, line by line otherwise.
//   - `...` is a wildcard: as a JSON value (anything), an array element (any number
//     of elements), an object member (any other members; without it an object must
//     have exactly the members shown), inside a string or a line (any text), or as a
//     line of its own (any number of lines).
//   - Without a shown status line the status must be 2xx, or the `status` of a
//     problem document the README shows, or a status shown alone (`# 204`), in which
//     case the body is not compared.
//   - A read (a command that sends no body and no -X) that does not match yet is
//     retried for a while: the worker persists usage and sends webhooks every
//     interval, and the README shows what a reader sees once it has.
//
// The api and worker use Redis database 15 of the test Redis, which the test owns (it
// flushes it before the run; the demo org's counters must start at zero), and one run
// at a time holds a Postgres advisory lock.
//
// # The README test
//
// `internal/readmetest` (`TestREADME`, in `make test`) makes README.md and docs/TOUR.md
// (the API tour) executable, so neither can drift:
// for each page (a subtest, `TestREADME/README` then `TestREADME/TOUR`) it extracts every
// command of its ```` ```sh ```` blocks that names `localhost:8080`, builds
// `quotaplane-api` and `quotaplane-worker` (once), seeds the demo org as `make run` does
// (`quotaplane-api demo --state-dir`) on a fresh database, starts both on free ports, and
// runs the commands in page order through bash exactly as printed, the README's and then
// the tour's on the same stack, as a reader runs them on one `make run` (so the tour
// builds on what the README made, and cannot collide with it unnoticed):
// only the address is rewritten, and the `OP=...`/`KEY=...` placeholders are set to the
// operator token and demo key. A `.curlrc` (through `CURL_HOME`) makes curl append each
// status, so a command stays as printed and its status is still checked. Each answer is
// compared with what the page shows under the command (its `# ` lines, or the fenced
// block right after the `sh` block): JSON structurally, other text line by line, a
// status line and the headers shown when curl prints them, with `...` as the one
// wildcard; a command that shows nothing must answer 2xx. Reads are retried for up to
// 30 s so the worker can flush and deliver. The package documentation has the rules in
// full; a new example needs nothing but its lines, and a new page one entry in `pages`.
// The pages' org ids are fixed, so the test owns Redis database 15 (flushed before the
// run) and runs one at a time under a Postgres advisory lock. The tour's client examples
// are run elsewhere: its Go client steps by `internal/clienttest`, its TypeScript blocks
// and install commands by `sdk/typescript/test/readme.test.ts`, each in a fresh directory
// as printed. `TestPagesNameTheRequiredFieldsOfTheRoutesTheyDescribe` checks that the
// paragraph introducing a route (a table in `required_test.go`: the throttle) names each
// field its body requires.
package readmetest
