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
package readmetest
