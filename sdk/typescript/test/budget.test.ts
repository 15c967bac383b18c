// The client's budget, retries, Retry-After, configuration errors, cancellation and
// hooks, against small servers that make the faults: a server that never answers, one
// that answers 503 with Retry-After, a plain http port spoken to in TLS.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { lookup } from "node:dns/promises";
import { describe, it } from "node:test";

import {
  QuotaplaneAbortError,
  QuotaplaneClient,
  QuotaplaneConfigError,
  QuotaplaneUnavailableError,
  VERSION,
  type AttemptEvent,
  type DecisionEvent,
  type RetryEvent,
} from "../src/index.js";
import { allowedResult, busy, scriptedServer, silentServer } from "./proxy.js";

const elapsed = (start: number) => performance.now() - start;

describe("budget", () => {
  // The fail policy answers a hung api within the client's whole budget, not after
  // every attempt's timeout (2 s per attempt, 2 retries by default).
  it("a hung api is answered by the fail policy within the default budget (1 s), not after every attempt's timeout", async () => {
    const silent = await silentServer();
    try {
      const client = new QuotaplaneClient({ baseUrl: silent.url, key: "k", failPolicy: "open" });
      const start = performance.now();
      const out = await client.check({ org: "acme" });
      const took = elapsed(start);
      assert.deepEqual([out.allowed, out.decidedBy], [true, "fail-policy"]);
      assert.ok(out.unavailable instanceof QuotaplaneUnavailableError);
      assert.ok(took >= 950 && took < 1400, `answered after ${Math.round(took)} ms, the budget is 1000`);

      // A call's own budget, and the reservation path too.
      const t2 = performance.now();
      const r = await client.reserve({ org: "acme", amount: 1 }, { budgetMs: 300 });
      assert.deepEqual([r.allowed, r.decidedBy], [true, "fail-policy"]);
      assert.ok(elapsed(t2) < 700, `reserve answered after ${Math.round(elapsed(t2))} ms, its budget is 300`);
    } finally {
      await silent.close();
    }
  });

  it("retries with capped exponential backoff and full jitter, within the budget", async () => {
    const srv = await scriptedServer(() => busy("")); // 503 without a Retry-After
    try {
      const retries: RetryEvent[] = [];
      const client = new QuotaplaneClient({ baseUrl: srv.url, key: "k", failPolicy: "closed", retries: 6, retryDelayMs: 40, maxRetryDelayMs: 100, budgetMs: 5000, onRetry: (e) => retries.push(e) });
      const out = await client.check({ org: "acme" });
      assert.deepEqual([out.allowed, out.decidedBy, out.unavailable?.attempts], [false, "fail-policy", 7]);
      assert.equal(retries.length, 6);
      retries.forEach((e, i) => {
        const cap = Math.min(100, 40 * 2 ** i);
        assert.ok(e.delayMs >= 0 && e.delayMs <= cap, `retry ${i + 1} waited ${e.delayMs} ms, over its cap ${cap}`);
        assert.equal(e.status, 503);
      });
      assert.equal(srv.seen.length, 7);
    } finally {
      await srv.close();
    }
  });
});

describe("Retry-After", () => {
  // Retry-After is waited in full, neither capped nor jittered downward: during the
  // api's "too many checks in flight" 503, a shorter wait would bring more load.
  it("is waited in full (delay-seconds and HTTP date), not capped nor jittered downward", async () => {
    for (const [name, header] of [
      ["seconds", () => "2"],
      ["HTTP date", () => new Date(Date.now() + 3000).toUTCString()],
    ] as const) {
      const srv = await scriptedServer((n) => (n === 1 ? busy(header()) : { status: 200, body: allowedResult }));
      try {
        const retries: RetryEvent[] = [];
        const client = new QuotaplaneClient({ baseUrl: srv.url, key: "k", budgetMs: 5000, maxRetryDelayMs: 100, onRetry: (e) => retries.push(e) });
        const out = await client.check({ org: "acme" });
        assert.deepEqual([out.allowed, out.decidedBy], [true, "quotaplane"], name);
        assert.equal(srv.seen.length, 2, name);
        const gap = srv.seen[1]!.at - srv.seen[0]!.at;
        // An HTTP date has whole seconds: 3 s ahead is 2 to 3 s away.
        assert.ok(gap >= 1990 && gap < 3300, `${name}: retried after ${Math.round(gap)} ms`);
        assert.equal(retries[0]?.delayMs, retries[0]?.retryAfterMs, `${name}: the wait is Retry-After's`);
      } finally {
        await srv.close();
      }
    }
  });

  it("beyond what is left of the budget, has the fail policy answer at once", async () => {
    const srv = await scriptedServer(() => busy("5"));
    try {
      const client = new QuotaplaneClient({ baseUrl: srv.url, key: "k", failPolicy: "closed" });
      const start = performance.now();
      const out = await client.check({ org: "acme" });
      assert.ok(elapsed(start) < 500, `answered after ${Math.round(elapsed(start))} ms`);
      assert.deepEqual([out.allowed, out.decidedBy, out.unavailable?.status, out.unavailable?.retryAfterSeconds], [false, "fail-policy", 503, 5]);
      assert.match(out.unavailable?.message ?? "", /Retry-After 5000 ms goes beyond its 1000 ms budget/);
      assert.equal(srv.seen.length, 1);
    } finally {
      await srv.close();
    }
  });
});

describe("configuration errors", () => {
  // A base URL fetch cannot use (an unknown scheme) is a configuration error, not a
  // failure to retry and then hand to the fail policy.
  it("a base URL fetch cannot use is refused by the constructor", () => {
    for (const baseUrl of ["htp://127.0.0.1:8080", "ftp://quota.internal", "quota.internal:8080"]) {
      assert.throws(() => new QuotaplaneClient({ baseUrl, key: "k", failPolicy: "open" }), (e: unknown) => e instanceof QuotaplaneConfigError, baseUrl);
    }
  });

  it("TLS to a plain port, a port fetch refuses and a name that does not resolve raise at once: no retry, no fail policy", async () => {
    const plain = await scriptedServer(() => ({ status: 200, body: allowedResult }));
    const bases = [plain.url.replace("http:", "https:"), "http://127.0.0.1:1"];
    // A name that does not resolve: only where the resolver answers so (not without a network).
    const nx = "quotaplane-test.invalid";
    const resolves = await lookup(nx).then(
      () => "resolves",
      (e: NodeJS.ErrnoException) => e.code,
    );
    if (resolves === "ENOTFOUND") bases.push(`http://${nx}`);
    else console.log(`# ${nx}: ${resolves}, its case is not run`);
    try {
      for (const baseUrl of bases) {
        const attempts: AttemptEvent[] = [];
        let asked = 0;
        const client = new QuotaplaneClient({ baseUrl, key: "k", retries: 3, failPolicy: () => (asked++, true), onAttempt: (e) => attempts.push(e) });
        for (const call of [() => client.check({ org: "acme" }), () => client.reserve({ org: "acme", amount: 1 }), () => client.checkBatch([{ org: "acme" }])]) {
          attempts.length = 0;
          const err = await call().then(
            () => assert.fail(`${baseUrl}: the call resolved`),
            (e: unknown) => e,
          );
          assert.ok(err instanceof QuotaplaneConfigError, `${baseUrl}: ${String(err)}`);
          assert.ok(err.cause instanceof TypeError, `${baseUrl}: cause ${String(err.cause)}`);
          assert.equal(attempts.length, 1, `${baseUrl}: retried`);
        }
        assert.equal(asked, 0, `${baseUrl}: the fail policy was asked`);
      }
      assert.equal(plain.seen.length, 0, "the TLS attempts reached the plain server as requests");
    } finally {
      await plain.close();
    }
  });

  it("a connection refused is not one: retried, then the fail policy", async () => {
    const srv = await scriptedServer(() => ({ status: 200, body: allowedResult }));
    const url = srv.url;
    await srv.close(); // nothing listens there now
    const client = new QuotaplaneClient({ baseUrl: url, key: "k", retries: 1, retryDelayMs: 1, failPolicy: "open" });
    const out = await client.check({ org: "acme" });
    assert.deepEqual([out.allowed, out.decidedBy, out.unavailable?.attempts], [true, "fail-policy", 2]);
  });
});

describe("cancellation", () => {
  // The caller's abort means "the caller gave up" (as Go's ctx.Err()), and does not go
  // to the fail policy; only the client's own budget does.
  it("the caller's abort rejects with QuotaplaneAbortError (AbortError), during an attempt or a backoff wait, never asking the fail policy", async () => {
    const silent = await silentServer();
    const busySrv = await scriptedServer(() => busy("2"));
    try {
      for (const [where, baseUrl] of [
        ["attempt", silent.url],
        ["backoff", busySrv.url],
      ] as const) {
        let asked = 0;
        const client = new QuotaplaneClient({ baseUrl, key: "k", budgetMs: 5000, failPolicy: () => (asked++, true) });
        const ac = new AbortController();
        setTimeout(() => ac.abort(new Error("caller gave up")), 150);
        const start = performance.now();
        const err = await client.check({ org: "x" }, { signal: ac.signal }).then(
          () => assert.fail(`${where}: resolved`),
          (e: unknown) => e,
        );
        assert.ok(elapsed(start) < 600, `${where}: rejected after ${Math.round(elapsed(start))} ms`);
        assert.ok(err instanceof QuotaplaneAbortError, `${where}: ${String(err)}`);
        assert.equal(err.name, "AbortError");
        assert.match(String((err.cause as Error).message), /caller gave up/);
        assert.equal(asked, 0, `${where}: the fail policy was asked`);
      }
      // Aborted before the call: not sent.
      const client = new QuotaplaneClient({ baseUrl: busySrv.url, key: "k", failPolicy: "open" });
      const before = busySrv.seen.length;
      await assert.rejects(client.check({ org: "x" }, { signal: AbortSignal.abort() }), QuotaplaneAbortError);
      assert.equal(busySrv.seen.length, before);
    } finally {
      await silent.close();
      await busySrv.close();
    }
  });
});

describe("hooks and headers", () => {
  it("sends User-Agent quotaplane-ts/<version>, the headers option (a traceparent function) and a call's headers; calls onAttempt, onRetry and onDecision", async () => {
    const pkg = JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8")) as { version: string };
    assert.equal(VERSION, pkg.version, "src/version.ts and package.json");
    const srv = await scriptedServer((n) => (n === 1 ? busy("0") : { status: 200, body: allowedResult, headers: { "Quotaplane-Warning": "would be denied" } }));
    try {
      const attempts: AttemptEvent[] = [];
      const retries: RetryEvent[] = [];
      const decisions: DecisionEvent[] = [];
      let trace = 0;
      const client = new QuotaplaneClient({
        baseUrl: srv.url,
        key: "k",
        headers: (call) => ({ traceparent: `00-${String(++trace).padStart(32, "0")}-00f067aa0ba902b7-01`, "X-Op": call.operation }),
        onAttempt: (e) => attempts.push(e),
        onRetry: (e) => retries.push(e),
        onDecision: (e) => {
          decisions.push(e);
          throw new Error("a broken hook changes nothing");
        },
      });
      const out = await client.check({ org: "acme" }, { headers: { "X-Request-Id": "r-1", Authorization: "Bearer stolen" } });
      assert.deepEqual([out.allowed, out.warning], [true, "would be denied"]);
      assert.equal(srv.seen.length, 2);
      for (const s of srv.seen) {
        assert.equal(s.headers["user-agent"], `quotaplane-ts/${pkg.version}`);
        assert.equal(s.headers["traceparent"], "00-00000000000000000000000000000001-00f067aa0ba902b7-01", "one traceparent per call, the same on its retry");
        assert.equal(s.headers["x-op"], "check");
        assert.equal(s.headers["x-request-id"], "r-1");
        assert.equal(s.headers["authorization"], "Bearer k", "a header cannot replace the key");
      }
      assert.deepEqual(
        attempts.map((a) => [a.operation, a.method, a.path, a.attempt, a.status]),
        [
          ["check", "POST", "/v1/check", 1, 503],
          ["check", "POST", "/v1/check", 2, 200],
        ],
      );
      assert.deepEqual(retries.map((r) => [r.attempt, r.delayMs, r.status, r.retryAfterMs]), [[1, 0, 503, 0]]);
      assert.deepEqual(decisions.map((d) => [d.operation, d.outcome.allowed, d.outcome.decidedBy]), [["check", true, "quotaplane"]]);
    } finally {
      await srv.close();
    }
  });
});

describe("batch items", () => {
  // An item the api refused (4xx) is an error, not a denial (`allowed: false`); a
  // per-item 503 goes to the fail policy for that item, as Go's client.
  it("a refused item is an error (no allowed), a 503 item is the fail policy's, the others Quotaplane's", async () => {
    const unavailable = { type: "https://quotaplane.dev/problems/service-unavailable", title: "Service Unavailable", status: 503 };
    const refused = { type: "https://quotaplane.dev/problems/bad-request", title: "Bad Request", status: 400, detail: 'user "zed" is not registered' };
    const srv = await scriptedServer(() => ({ status: 200, body: { results: [allowedResult, unavailable, refused, { ...allowedResult, allowed: false, retry_after_seconds: 3 }] } }));
    try {
      const client = new QuotaplaneClient({ baseUrl: srv.url, key: "k", failPolicy: "open" });
      const out = await client.checkBatch([{ org: "a" }, { org: "a" }, { org: "a", user: "zed" }, { org: "a" }]);
      assert.deepEqual(
        out.map((o) => [o.allowed, o.decidedBy, o.error?.status, o.unavailable?.status]),
        [
          [true, "quotaplane", undefined, undefined],
          [true, "fail-policy", undefined, 503],
          [undefined, undefined, 400, undefined],
          [false, "quotaplane", undefined, undefined],
        ],
      );
      assert.match(out[2]!.error!.message, /not registered/);
    } finally {
      await srv.close();
    }
  });
});
