// Package console is the server side of the web console for org admins: it serves the
// built single-page app at /console/, signs console users in and out, and keeps their
// sessions. The app itself talks to the same /v1 API as every other client; the HTTP
// layer accepts a session cookie there as a principal (see Authenticate).
//
// Sessions: a random 256-bit id travels in an HttpOnly, SameSite=Strict cookie (Secure
// when the request came over TLS) and only its SHA-256 is stored in Postgres, with an
// idle and an absolute expiry. Every change made with the cookie must carry the
// session's CSRF token in the X-CSRF-Token header. Sign-ins are limited before their
// password is hashed, and failures slow the address they come from, never the
// account (guard.go).
//
// # Console
//
// The console is a single-page app (`web/`, TypeScript + Preact + Chart.js, built by Vite)
// that talks to the public `/v1` API like any client; it has no API of its own besides
// three endpoints in `internal/console`: `GET /console/api/session` (200 with the session
// and its CSRF token, 204 when signed out: a 401 there would put an error in the browser's
// console on every visit), `POST /console/api/sign-in` (`{"org", "email", "password"}`: console emails are unique per org only, see Auth) and `POST /console/api/sign-out`. The sign-in form has an Organization field, filled from `?org=` or the one the browser signed in to last (localStorage).
//
//   - Build and embed. `web/dist` is committed and embedded by the `web` Go package
//     (`//go:embed all:dist`), so `go build` from a clean checkout needs no Node.js.
//     Vite's output is deterministic, so `make web-check` (part of `make test`) rebuilds
//     into a temporary directory and fails when it differs from the committed files.
//     `internal/console` serves them: hashed `assets/` as immutable, `index.html` with
//     `no-cache` and a strict CSP (`default-src 'self'`, `frame-ancestors 'none'`), and
//     `index.html` for any other path under `/console/` so the app's routes survive reloads.
//   - Sessions. 32 random bytes (base64url) in the `qp_session` cookie: `HttpOnly`,
//     `SameSite=Strict`, `Path=/` (the app's `/v1` calls carry it). When the request
//     reached the api over HTTPS (`r.TLS`, or `X-Forwarded-Proto: https` from a peer in
//     `QUOTA_TRUSTED_PROXIES`; internal/platform/forwarded) or `QUOTA_CONSOLE_SECURE_COOKIES=on`,
//     it is `Secure` and named `__Host-qp_session` instead, and such a request reads only
//     that name (a sibling host cannot plant a `__Host-` cookie). The table
//     `console_sessions` (migration 000005) keeps the SHA-256 of the id, the user, and
//     `expires_at` (12 h after sign-in) and `last_seen_at` (30 min idle timeout, written at
//     most once a minute). A lookup joins `console_users`, so a deleted user's sessions end
//     (cascade) and a changed role applies at once. Sign-in sweeps ended sessions.
//   - CSRF. The token is SHA-256 of a fixed label and the session id: per session,
//     unguessable without the HttpOnly cookie, and stored nowhere. Every non-GET/HEAD/OPTIONS
//     request authenticated by the cookie must carry it in `X-CSRF-Token` (403 otherwise);
//     sign-in itself must be `application/json`, which a cross-site form cannot send
//     without a CORS preflight that this server never grants. SameSite=Strict is a second
//     layer.
//   - Sign-in limits, no lockout (internal/console/guard.go). Before any
//     password is hashed a sign-in must pass, in order: the delay of its (client address,
//     org, email) (3 free failures, then 1 s doubling to 15 min; a success clears it), its
//     address's failures across accounts (20, then 1 a minute: spraying), its address's
//     rate (`QUOTA_SIGNIN_IP_RATE_LIMIT`, 30/m) and the replica's (`QUOTA_SIGNIN_RATE_LIMIT`,
//     10/s); each refusal is a 429 with `Retry-After`. Token buckets are
//     `golang.org/x/time/rate`, kept in two LRU tables (hashicorp/golang-lru) of 10,000
//     entries under one mutex; entries are added only after a hash, which the global rate
//     bounds. Then the hash needs one of `QUOTA_PASSWORD_HASHES` slots (half of
//     `GOMAXPROCS`, 1 to 4; `tenants.passwordHasher`), else 503 with `Retry-After` at once:
//     argon2id holds 19 MiB per hash, so the slots bound the memory of hashing, and half
//     the CPUs stay with the checks. The per-account lock (migration 000019 drops
//     `failed_logins` and `locked_until`) let anyone who knew an email keep it locked; the
//     delay is the stranger's address's only. Unknown email and wrong password give the
//     same 401 body after one hash each. `TestSignInFloodKeepsTheAPIUp` floods a real api.
//   - Password change. `POST /console/api/password` (`{"current_password",
//     "new_password"}`, with the CSRF token) checks the current password under the sign-in
//     limits, sets the new one through `tenants.SetConsolePassword`, which ends every
//     session of the user in its transaction (an operator or admin setting it does too),
//     and starts a new session: the answer is a sign-in's. A wrong current password is a
//     403 and counts as a failure of that address and email.
//   - Unknown cookies. A cookie that is not 32 bytes of base64url names no session
//     without a query; one that named no session in Postgres is remembered (its hash) for a
//     minute in an LRU of 10,000 (hashicorp/golang-lru's expirable), so repeating a stale or
//     made-up cookie costs one query a minute.
//   - Principal. `httpapi`'s authenticate middleware takes the cookie only when there is
//     no `Authorization` header. A session becomes a principal like an org key of its org
//     with scopes `admin` and `billing` (never `check`, never operator); a `viewer` session
//     is refused (403) on anything but GET/HEAD before any handler runs, so no route can
//     forget the rule. Audit entries name the actor `console:<email>`.
//   - Usage chart. "Usage over the period" plots each metric's `daily` series from the
//     usage API (`dailySeries` in `format.ts`): 0 at the period's start, each recorded day at
//     its end, gaps carried forward (no change), today's point at now, then flat to now.
//     The dashed "projection at this pace" starts from that last real point and continues at
//     the average daily pace so far to the period's end. Where the org has a month limit of
//     the metric it is drawn as a red line, however far below it usage is (usage then hugs
//     the axis, which is what the chart has to say, on every metric's chart alike). With
//     no history the panel says so ("No daily history yet") instead of drawing anything.
//     Days before the worker's first flush of a period have no rows and so draw as no
//     change; the first point then carries everything used before it.
//     Today's point sits at the exact now (not rounded): a first point of today is a step
//     from the flat run at today's start, never a ramp from day 0.
//   - Code. One page per file (`web/src/pages/*.tsx`); `App.tsx` holds only the route
//     table and the shell. The API's types are the ones openapi-typescript generates from
//     `api/openapi.yaml` into `sdk/typescript/src/schema.d.ts` (`make generate`), imported
//     type-only by `web/src/api.ts` (erased by Vite, read by `tsc`); only the console's own
//     session is typed by hand. Cursor-paged lists share one hook, `usePaged` (`ui.tsx`).
//   - Allocation page. The org loads first; usage (`GET /v1/orgs/{org}/usage`) and each
//     team's users follow, so editing never waits on them. `allocation.ts` joins them into
//     one row per limit of every team and user (registered users: their own limits over the
//     team's user defaults, per metric and window, as `tenants.MergeLimits` does; users seen
//     only in usage: the defaults), forecasts month limits at the period's average pace so
//     far (`forecast`: used up / runs out on a UTC day / lasts the period / nothing used
//     yet) and sorts them by closeness to exhaustion in tiers (`sortRows`, said on the page
//     by `EXHAUSTION_ORDER`): month limits used up or running out this period, soonest
//     first; then the other month limits and the day limits, fullest first; then hour,
//     minute and second windows and concurrent limits, fullest first; last, whatever has
//     nothing used or held. A short window resets within the minute or the hour, while a
//     month limit that runs out stays out until the period ends, so a minute window used
//     up never leads the list.
//     Reservations: usage's month `WindowUsage.used` counts committed and held units alike,
//     so a month row splits it into `used` and `reserved` (the level's `reserved`); a shorter
//     window's bucket cannot be split and shows held units in used. Share, colour and the
//     forecast's exhaustion go by used + reserved, as the API counts them; the forecast's
//     pace by used alone (a hold is one-off, not a rate). `MiniBar` draws the held units as
//     a lighter second segment ("x used + y reserved of z"); `heldRows` lists the teams and
//     users with `reserved` > 0, most held first, for the "Held by open reservations"
//     panel, with the number of open reservations holding each row's units (a team's row
//     counts its users' too) from `GET /v1/orgs/{org}/reservations`, read up to 10 pages of
//     100 with the usage (a `+` after the count says there were more); Show expands a
//     row into its reservations (id, metric, amount, `expires in` relative to now,
//     on_expiry), paged with `usePaged` and the route's `team`/`user` filter.
//   - Webhooks page. The URL, edited in place (`PATCH /v1/orgs/{org}` with `webhook_url`),
//     with the API's `url_warning` and why it is refused beside it; "Send a test event"
//     (`POST /v1/orgs/{org}/webhook/test`) and its result; the signing secret (masked until
//     "Show", with a copy button; viewers get the API's note instead) with how to verify a
//     signature, and the delivery log with "Load older deliveries" pagination.
//   - Shadow and warn report (`web/src/pages/ShadowReport.tsx`, `/console/shadow-report`,
//     linked from the Mode page rather than the navigation bar, which has no room left):
//     the would-block API's answer for a picked period, one bar per limit that would have
//     blocked (most checks first), a strip of the period's days per row, and the totals per
//     day with the days named; the `other` row and a note when the cap was reached. Its
//     types come from the generated `sdk/typescript/src/schema.d.ts`.
//   - Entitlements (`web/src/pages/Entitlements.tsx`, `/console/entitlements`, linked
//     from the overview's plan card, not the full navigation bar): the org's
//     resolved features from `GET /v1/orgs/{org}/features`, each with its value (yes/no, a
//     number, a string), whether it comes from the plan or an org override, and the plan's
//     own value; a feature an override removes is listed as such. Read-only for everyone:
//     only the operator sets features (!screenshot).
//   - Money: usage marks the metric `spend` with its `currency`, and its
//     values are integers in micro-units (1 USD = 1,000,000). Wherever the console shows a
//     metric's usage, allocation, remainder or forecast (the overview's bars, history and
//     chart axis, remainder and top lists; the allocation page's panels, rows and "about
//     ... by its end"), a metric with a currency is written as money, "1,234.56 USD of
//     2,000.00", by `formatMicros` (`web/src/format.ts`): BigInt division to the cent,
//     rounded half up, so no float rounding shows (`1.005` USD is "1.01", not
//     `toFixed`'s "1.00") and amounts past 2^53 micro-units stay exact. Other metrics keep
//     their units, and so does the allocation page's first line ("spend 500.00 USD").
//     Vitest: `web/src/money.test.tsx`, `web/src/pages/Entitlements.test.tsx`; Chromium:
//     `web/e2e/entitlements.test.mjs` (!screenshot). The limits editor
//     (`web/src/limits.tsx`) and the new-team form show and take a spend limit in the
//     currency too ("200.00 USD"; exact, with up to six decimals where the micro-units
//     need them, by `formatMicrosExact`) and send micro-units: `parseMoney` reads "1,000.25"
//     or "12.50 USD" by string and BigInt arithmetic, and refuses rather than rounds what
//     it cannot read exactly (more than six decimals, "1.000,50"). The currency comes from
//     the usage API, which the allocation page loads after the teams: until it arrives (or
//     when it cannot be read) spend limits are shown and edited in micro-units, and a field
//     keeps the unit it opened with, so a number typed as micro-units is never sent as an
//     amount. The api already words spend's allocation 422s as money.
//   - Tests. `internal/console` (Go, real Postgres): cookie flags with and without TLS,
//     hashed storage, equal failures, lockout and its doubling, CSRF refusal, viewer 403s,
//     expiry (idle and absolute, with a fake clock), sign-out, static serving.
//     `web/src/*.test.ts(x)` (Vitest, jsdom): formatting, limit parsing, allocation
//     arithmetic, the limits editor's 422 handling and inherited defaults, the chart's points
//     (a first point today), the forecast and the allocation rows' order, the sign-in title.
//     `web/e2e/console.test.mjs` (node's
//     test runner, playwright-core driving Debian's Chromium, `make test-e2e`): builds and
//     starts a real `quotaplane-api` on a free port with a fresh database and the shared
//     Redis, seeds an org through the operator API, and walks the console's scenarios; each
//     test saves a screenshot under `test-output/e2e/` and fails on any console error it
//     did not expect (only the refused requests' 422/403 are expected). The api runs without
//     a worker there, so the overview's history is today's live point, and the webhook
//     test writes two delivery rows with psql to see the log rendered. The api runs
//     without `QUOTA_WEBHOOK_ALLOW_PRIVATE`, as in production, so the test event to a
//     receiver on 127.0.0.1 is the refusal case; the delivered case is the Go test
//     `TestSendWebhookTest` (a real receiving `httptest` server, the signature verified).
//     The seed has a team and a user with 128-character ids, which every page must fit at
//     390 px. `web/e2e/shadow-report.test.mjs` starts its own api the same
//     way, makes a shadow org's checks over its limits and compares the report page with the
//     checks' `would_block` answers, with earlier days seeded into `would_block` with psql as
//     a worker would have persisted them. `web/e2e/reservations.test.mjs` starts its own api
//     the same way, opens three reservations with a check key of the org
//     (`POST /v1/reservations`, two of alice's), checks the allocation page's bars, text and
//     colour and the held panel against the usage API's `reserved`, the count of open
//     reservations per row, and alice's and her team's expanded lists (ids in expiry order,
//     amounts, `expires in`, on_expiry) against the listing route, then releases them and
//     sees them go. `web/e2e/entitlements.test.mjs` starts its own api the same way, seeds
//     a plan with features, a 500 USD monthly spend budget carved into a team's and a
//     user's, and the operator's overrides, and compares the Entitlements page with
//     `GET /v1/entitlements`; its second test makes a priced check and reads "2.50 USD of
//     500.00" on the overview and the allocation page (it never skips: money is part of
//     every api).
//     `web/e2e/nav.test.mjs` starts its own api the same way and signs in at 1280x800,
//     1024x768, 800x600 and 390x844: every navigation link, the brand and the signed-in
//     user's items must lie inside the window, overlap none of the others and be what a
//     click at their centre reaches, the page must not scroll sideways, and the last link
//     must open its page; at 1280 px every item shares one row (the signed-in email is cut
//     short past 10rem, whole in its title). The top bar wraps rather than scrolls (`web/src/styles.css`):
//     the links stay whole beside the brand while they fit, the user's items take a line of
//     their own on the right when they do not, and the links wrap among themselves only in
//     a window narrower than all of them; it scrolled its links sideways, which at 1280 px
//     cut "Webhooks" off and hid "Mode" under the user's items. `bash scripts/e2e.sh
//     e2e/nav.test.mjs` runs one file (paths relative to `web/`); without arguments every
//     file runs.
//     `web/e2e/layout.test.mjs` starts its own api the same way and, at 1280 and 390 px,
//     finds no word split over two lines in the webhooks page's panel and delivery table
//     (a long URL) or the allocation table (128-character ids), draws the month limit on
//     the chart of a metric far below it as on one near it (red pixels counted on the
//     canvas), and ranks a minute window used up after every month limit with something
//     used. `brokenWords` (`web/e2e/harness.mjs`) finds a split word: a word whose Range
//     has client rectangles on two lines; a hyphenated word may break after its hyphens,
//     and a URL only after "/", ".", "?", "&", "=", "#" or "-".
//   - Words in tables (`web/src/styles.css`). A table never splits a word to fit its
//     box: headings wrap between words, cells keep each word's width in the column's
//     minimum (`overflow-wrap: break-word`, not `anywhere`, which split "Attempt" into
//     "Attemp/t" at 390 px), and a table wider than its box scrolls sideways inside its
//     `.table-wrap`; the allocation and delivery tables keep a minimum width so their
//     rows stay a line or two rather than every column squeezed to its longest word. An
//     id in a cell (`Id`, `ui.tsx`) stays on one line, cut short with an ellipsis past
//     16rem (10rem on a phone) and whole in its title; a URL (`URLText`, `urlPieces` in
//     `format.ts`) wraps only after "/", ".", "?", "&", "=", "#" or "-", by `<wbr>`.
package console
