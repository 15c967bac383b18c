// checkMiddleware and reserveMiddleware in a real Express app, in front of a real
// quotaplane-api.
import assert from "node:assert/strict";
import type { AddressInfo } from "node:net";
import type { Server } from "node:http";
import { after, before, describe, it } from "node:test";

import express, { type ErrorRequestHandler } from "express";
import { parseList } from "structured-headers";

import { checkMiddleware, QuotaplaneClient, QuotaplaneError, QuotaplaneMiddlewareError, reportUsage, reserveMiddleware, type AttemptEvent, type Settled } from "../src/index.js";
import { freePort, Stack, withoutMetric } from "./harness.js";
import { silentServer } from "./proxy.js";

let stack: Stack;
before(async () => {
  stack = await Stack.start();
});
after(async () => {
  await stack?.stop();
});

async function serve(app: express.Express): Promise<{ url: string; close: () => Promise<void> }> {
  const srv: Server = await new Promise((resolve) => {
    const s = app.listen(0, "127.0.0.1", () => resolve(s));
  });
  const { port } = srv.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    close: () => new Promise((resolve) => srv.close(() => resolve())),
  };
}

/** muteConsoleError collects what console.error prints until restore. */
function muteConsoleError(): string[] & { restore: () => void } {
  const orig = console.error;
  const lines = [] as unknown as string[] & { restore: () => void };
  console.error = (...args: unknown[]) => void lines.push(args.map(String).join(" "));
  lines.restore = () => (console.error = orig);
  return lines;
}

const errors: ErrorRequestHandler = (err, _req, res, _next) => {
  const cause = err instanceof QuotaplaneMiddlewareError ? err.cause : undefined;
  res.status(500).json({ error: cause instanceof QuotaplaneError ? `quotaplane ${cause.status}` : String(err) });
};

describe("checkMiddleware", () => {
  it("lets allowed requests through with RateLimit-*, and answers a denied one 429 with Retry-After, RateLimit-* and a problem", async () => {
    const { org, key } = await stack.org({ limits: [{ metric: "requests", window: "minute", limit: 2 }] });
    const client = new QuotaplaneClient({ baseUrl: stack.baseUrl, key });
    let handled = 0;
    const app = express();
    app.get(
      "/work",
      checkMiddleware(client, { check: (req: express.Request) => ({ org, user: req.get("X-User") ?? undefined }) }),
      (_req, res) => {
        handled++;
        res.json({ ok: true });
      },
    );
    const srv = await serve(app);
    try {
      for (const remaining of ["1", "0"]) {
        const res = await fetch(`${srv.url}/work`);
        assert.equal(res.status, 200);
        assert.deepEqual(await res.json(), { ok: true });
        assert.equal(res.headers.get("RateLimit-Limit"), "2");
        assert.equal(res.headers.get("RateLimit-Remaining"), remaining);
        assert.match(res.headers.get("RateLimit-Reset") ?? "", /^\d+$/);
        assert.equal(res.headers.get("Retry-After"), null);
        draftFieldsAgree(res, remaining);
      }
      const res = await fetch(`${srv.url}/work`);
      assert.equal(res.status, 429);
      assert.equal(res.headers.get("Content-Type"), "application/problem+json");
      const retry = res.headers.get("Retry-After");
      assert.match(retry ?? "", /^[1-9]\d*$/);
      assert.equal(res.headers.get("RateLimit-Limit"), "2");
      assert.equal(res.headers.get("RateLimit-Remaining"), "0");
      assert.equal(res.headers.get("RateLimit-Reset"), retry);
      draftFieldsAgree(res, "0");
      const problem = (await res.json()) as { blocked_at?: unknown };
      problem.blocked_at = withoutMetric(problem.blocked_at);
      assert.deepEqual(problem, {
        type: "https://quotaplane.dev/problems/too-many-requests",
        title: "Too Many Requests",
        status: 429,
        detail: `over quota at org "${org}" (minute); retry after ${retry} s`,
        retry_after_seconds: Number(retry),
        blocked_at: { level: "org", id: org, window: "minute" },
      });
      assert.equal(handled, 2, "the handler ran for a denied request");
    } finally {
      await srv.close();
    }
  });

  it("answers a cost no token bucket can ever hold 429 without Retry-After", async () => {
    const { org, key } = await stack.org({ limits: [{ metric: "requests", window: "second", limit: 10, burst: 2 }] });
    const client = new QuotaplaneClient({ baseUrl: stack.baseUrl, key });
    const app = express();
    app.get("/work", checkMiddleware(client, { check: () => ({ org, cost: 3 }) }), (_req, res) => void res.json({ ok: true }));
    const srv = await serve(app);
    try {
      const res = await fetch(`${srv.url}/work`);
      assert.equal(res.status, 429);
      assert.equal(res.headers.get("Retry-After"), null);
      const problem = (await res.json()) as { detail?: string; retry_after_seconds?: number };
      assert.equal(problem.detail, `over quota at org "${org}" (second); the cost can never fit`);
      assert.equal(problem.retry_after_seconds, undefined);
    } finally {
      await srv.close();
    }
  });

  it("answers 503 when the fail policy refuses, and hands Quotaplane's refusal to the error handler with onError \"next\"", async () => {
    const dead = new QuotaplaneClient({ baseUrl: `http://127.0.0.1:${await freePort()}`, key: "k", failPolicy: "closed", retries: 0 });
    const badKey = new QuotaplaneClient({ baseUrl: stack.baseUrl, key: "qpk_bad_bad" });
    let handled = 0;
    const app = express();
    const handler: express.RequestHandler = (_req, res) => {
      handled++;
      res.json({ ok: true });
    };
    app.get("/closed", checkMiddleware(dead, { check: () => ({ org: "acme" }) }), handler);
    app.get("/badkey", checkMiddleware(badKey, { onError: "next", check: () => ({ org: "acme" }) }), handler);
    app.get("/free", checkMiddleware(dead, { check: () => null }), handler);
    app.use(errors);
    const srv = await serve(app);
    try {
      const closed = await fetch(`${srv.url}/closed`);
      assert.equal(closed.status, 503);
      assert.equal(closed.headers.get("Content-Type"), "application/problem+json");
      assert.equal(closed.headers.get("Retry-After"), "1");
      assert.deepEqual(await closed.json(), {
        type: "https://quotaplane.dev/problems/service-unavailable",
        title: "Service Unavailable",
        status: 503,
        detail: "the quota service cannot be reached; retry later",
      });
      const bad = await fetch(`${srv.url}/badkey`);
      assert.equal(bad.status, 500);
      assert.deepEqual(await bad.json(), { error: "quotaplane 401" });
      assert.equal(handled, 0);
      assert.equal((await fetch(`${srv.url}/free`)).status, 200);
      assert.equal(handled, 1);
    } finally {
      await srv.close();
    }
    // By default the middleware answers itself: 500, a problem+json without
    // Quotaplane's detail (its 401 is the service's problem, not its caller's).
    const plain = express();
    plain.get("/", checkMiddleware(badKey, { check: () => ({ org: "acme" }) }), handler);
    const srv2 = await serve(plain);
    const logged = muteConsoleError();
    try {
      const res = await fetch(srv2.url);
      assert.equal(res.status, 500);
      assert.equal(res.headers.get("Content-Type"), "application/problem+json");
      assert.deepEqual(await res.json(), {
        type: "https://quotaplane.dev/problems/quota-misconfigured",
        title: "Internal Server Error",
        status: 500,
        detail: "the quota service refused this service's credentials",
      });
      assert.match(logged.join("\n"), /401/, "the operator is told why");
    } finally {
      logged.restore();
      await srv2.close();
    }
  });

  // A check Quotaplane refuses (a user that is not registered, with no team named: 400
  // "user is not registered: name its team") is answered by the middleware, never
  // handed to Express, whose default handler would answer 500 with an HTML stack trace.
  it("answers a request Quotaplane refused (an unregistered user, no team) 403 with a problem+json, in Express's development mode too", async () => {
    const { org, key } = await stack.org({ limits: [{ metric: "requests", window: "minute", limit: 100 }] });
    await stack.api_("POST", `/v1/orgs/${org}/teams`, { id: "eng", name: "Eng" });
    const client = new QuotaplaneClient({ baseUrl: stack.baseUrl, key });
    let handled = 0;
    const app = express();
    app.set("env", "development"); // finalhandler's HTML stack trace, as a newcomer's app has it
    const handler: express.RequestHandler = (_req, res) => {
      handled++;
      res.json({ ok: true });
    };
    app.get("/api/no-team", checkMiddleware(client, { check: (req: express.Request) => ({ org, user: req.get("X-User") }) }), handler);
    // The tour's example names the team: a user met for the first time joins it.
    app.get("/api/team", checkMiddleware(client, { check: (req: express.Request) => ({ org, team: "eng", user: req.get("X-User") }) }), handler);
    // A handler of the app's own.
    const seen: number[] = [];
    app.get(
      "/api/custom",
      checkMiddleware(client, {
        check: (req: express.Request) => ({ org, user: req.get("X-User") }),
        onError: (err, _req, res: express.Response) => {
          seen.push((err.cause as QuotaplaneError).status);
          res.status(400).json({ error: "who are you?" });
        },
      }),
      handler,
    );
    const srv = await serve(app);
    try {
      const res = await fetch(`${srv.url}/api/no-team`, { headers: { "X-User": "zed" } });
      const text = await res.text();
      assert.equal(res.status, 403, text);
      assert.equal(res.headers.get("Content-Type"), "application/problem+json");
      assert.doesNotMatch(text, /<html|<pre>|at .*\.js:\d+/i, "no HTML, no stack trace");
      const problem = JSON.parse(text) as Record<string, unknown>;
      assert.equal(problem.type, "https://quotaplane.dev/problems/quota-refused");
      assert.equal(problem.status, 403);
      assert.equal(problem.quota_status, 400);
      assert.match(String(problem.detail), /^the quota service refused this request: .*not registered.*team/);
      assert.equal(handled, 0);

      const named = await fetch(`${srv.url}/api/team`, { headers: { "X-User": "zed" } });
      assert.equal(named.status, 200, await named.clone().text());
      assert.deepEqual(await named.json(), { ok: true });
      assert.equal(handled, 1);

      const custom = await fetch(`${srv.url}/api/custom`, { headers: { "X-User": "yan" } });
      assert.equal(custom.status, 400);
      assert.deepEqual(await custom.json(), { error: "who are you?" });
      assert.deepEqual(seen, [400]);
      assert.equal(handled, 1);
    } finally {
      await srv.close();
    }
  });
});

describe("reserveMiddleware (needs the reservations API of branch res)", () => {
  it("reserves before the handler and commits the cost it reported after it", async () => {
    const { org, key } = await stack.org({ limits: [{ metric: "tokens", window: "month", limit: 1000 }] });
    const client = new QuotaplaneClient({ baseUrl: stack.baseUrl, key });
    const settled: Settled[] = [];
    let onSettled: () => void = () => {};
    const app = express();
    app.post(
      "/complete",
      reserveMiddleware(client, {
        reserve: (req: express.Request) => ({ org, metric: "tokens", amount: Number(req.query.max ?? 400) }),
        onSettled: (s) => {
          settled.push(s);
          onSettled();
        },
      }),
      (req, res) => {
        reportUsage(res, Number(req.query.used));
        res.json({ text: "..." });
      },
    );
    const srv = await serve(app);
    try {
      const done = new Promise<void>((resolve) => (onSettled = resolve));
      const res = await fetch(`${srv.url}/complete?used=137`, { method: "POST" });
      assert.equal(res.status, 200);
      assert.match(res.headers.get("RateLimit-Limit") ?? "", /^\d+$/);
      await done;
      const s = settled[0]!;
      assert.equal(s.error, undefined, String(s.error));
      assert.equal(s.used, 137);
      assert.equal(s.result?.state, "committed");
      assert.deepEqual([s.result?.amount, s.result?.used, s.result?.released], [400, 137, 263]);
      assert.equal((await client.getReservation(s.reservation!.id)).state, "committed");
      const probe = await client.check({ org, metric: "tokens", cost: 0 });
      assert.equal(probe.result?.levels[0]?.used, 137);

      // More than what is left is refused before the handler, as a denied check.
      const denied = await fetch(`${srv.url}/complete?max=900&used=1`, { method: "POST" });
      assert.equal(denied.status, 429);
      assert.equal(denied.headers.get("Content-Type"), "application/problem+json");
      assert.match(denied.headers.get("Retry-After") ?? "", /^[1-9]\d*$/);
      const body = (await denied.json()) as { status: number; blocked_at: unknown };
      assert.equal(body.status, 429);
      assert.deepEqual(withoutMetric(body.blocked_at), { level: "org", id: org, window: "month" });
      assert.equal(settled.length, 1);
    } finally {
      await srv.close();
    }
  });

  it("settles a request whose handler reported nothing as `unreported` says", async () => {
    const { org, key } = await stack.org({ limits: [{ metric: "tokens", window: "month", limit: 1000 }] });
    const client = new QuotaplaneClient({ baseUrl: stack.baseUrl, key });
    for (const [unreported, state, used] of [
      ["commit", "committed", 50],
      ["release", "released", 0],
    ] as const) {
      let settle: (s: Settled) => void = () => {};
      const done = new Promise<Settled>((resolve) => (settle = resolve));
      const app = express();
      app.get("/", reserveMiddleware(client, { unreported, reserve: () => ({ org, metric: "tokens", amount: 50 }), onSettled: settle }), (_req, res) => {
        res.send("done");
      });
      const srv = await serve(app);
      try {
        assert.equal((await fetch(srv.url)).status, 200);
        const s = await done;
        assert.equal(s.error, undefined, String(s.error));
        assert.equal(s.result?.state, state);
        const before = unreported === "commit" ? 0 : 50;
        assert.equal((await client.check({ org, metric: "tokens", cost: 0 })).result?.levels[0]?.used, before + used);
      } finally {
        await srv.close();
      }
    }
  });
});

// draftFieldsAgree: the middleware passes Quotaplane's draft-11 fields on, beside the
// legacy ones, read with a structured-field parser library: the path's one policy (the
// org's 2 a minute) and RateLimit naming it with the legacy figures.
function draftFieldsAgree(res: Response, remaining: string): void {
  const policies = parseList(res.headers.get("RateLimit-Policy") ?? "");
  assert.equal(policies.length, 1, "RateLimit-Policy items");
  const [name, params] = policies[0] as [unknown, Map<string, unknown>];
  assert.equal(String(name), "org-minute");
  assert.equal(params.get("q"), 2);
  assert.equal(params.get("w"), 60);
  const limits = parseList(res.headers.get("RateLimit") ?? "");
  assert.equal(limits.length, 1, "RateLimit items");
  const [lname, lparams] = limits[0] as [unknown, Map<string, unknown>];
  assert.equal(String(lname), "org-minute");
  assert.equal(String(lparams.get("r")), remaining);
  assert.equal(String(lparams.get("t")), res.headers.get("RateLimit-Reset"));
}

/** A logger that keeps what it is told. */
function memLogger(): { warn: string[]; error: string[]; logger: { warn: (m: string, ...a: unknown[]) => void; error: (m: string, ...a: unknown[]) => void } } {
  const warn: string[] = [];
  const error: string[] = [];
  return {
    warn,
    error,
    logger: {
      warn: (m, ...a) => void warn.push([m, ...a.map(String)].join(" ")),
      error: (m, ...a) => void error.push([m, ...a.map(String)].join(" ")),
    },
  };
}

/** Resolves with the next value given to the returned push function. */
function nextSettled(): { push: (s: Settled) => void; next: () => Promise<Settled> } {
  const items: Settled[] = [];
  const waiters: ((s: Settled) => void)[] = [];
  return {
    push: (s) => {
      const w = waiters.shift();
      if (w) w(s);
      else items.push(s);
    },
    next: () => {
      const s = items.shift();
      return s ? Promise.resolve(s) : new Promise((resolve) => waiters.push(resolve));
    },
  };
}

describe("middleware options (issue 31)", () => {
  it("skip lets a request through unasked; req.quotaplane carries the decision to the handler; onDenied answers a denial", async () => {
    const { org, key } = await stack.org({ limits: [{ metric: "requests", window: "month", limit: 1 }] });
    const client = new QuotaplaneClient({ baseUrl: stack.baseUrl, key });
    const app = express();
    const denials: string[] = [];
    app.get(
      "/work",
      checkMiddleware(client, {
        skip: (req: express.Request) => req.get("X-Health") === "1",
        check: () => ({ org }),
        onDenied: (decision, req: express.Request, res: express.Response) => {
          denials.push(`${decision.operation} ${decision.decidedBy} ${req.quotaplane === decision}`);
          res.status(402).json({ upgrade: true, retry: decision.retryAfterSeconds });
        },
      }),
      (req: express.Request, res) => {
        const d = req.quotaplane;
        res.json(d ? { operation: d.operation, allowed: d.allowed, decidedBy: d.decidedBy, remaining: d.rateLimit?.remaining } : { skipped: true });
      },
    );
    const srv = await serve(app);
    try {
      for (let i = 0; i < 2; i++) {
        const skipped = await fetch(`${srv.url}/work`, { headers: { "X-Health": "1" } });
        assert.deepEqual([skipped.status, await skipped.json()], [200, { skipped: true }]);
      }
      const first = await fetch(`${srv.url}/work`);
      assert.deepEqual([first.status, await first.json()], [200, { operation: "check", allowed: true, decidedBy: "quotaplane", remaining: 0 }], "the skipped requests counted");
      const denied = await fetch(`${srv.url}/work`);
      assert.equal(denied.status, 402);
      const body = (await denied.json()) as { upgrade: boolean; retry: number };
      assert.equal(body.upgrade, true);
      assert.ok(body.retry >= 1);
      assert.deepEqual(denials, ["check quotaplane true"]);
    } finally {
      await srv.close();
    }
  });

  it("forwards Quotaplane-Warning of an org in warn mode", async () => {
    const { org, key } = await stack.org({ limits: [{ metric: "requests", window: "month", limit: 1 }] });
    await stack.api_("PATCH", `/v1/orgs/${org}`, { mode: "warn" });
    const client = new QuotaplaneClient({ baseUrl: stack.baseUrl, key });
    const app = express();
    app.get("/", checkMiddleware(client, { check: () => ({ org }) }), (_req, res) => void res.send("ok"));
    const srv = await serve(app);
    try {
      assert.equal((await fetch(srv.url)).headers.get("Quotaplane-Warning"), null);
      const over = await fetch(srv.url);
      assert.equal(over.status, 200, "warn mode allows");
      assert.ok(over.headers.get("Quotaplane-Warning"), "the warning was not forwarded");
    } finally {
      await srv.close();
    }
  });

  it("the default error handler logs and answers problem+json: an unregistered user 403 (warned), a misconfigured client 500 (logged), never HTML", async () => {
    const { org, key } = await stack.org({ limits: [{ metric: "requests", window: "minute", limit: 100 }] });
    await stack.api_("POST", `/v1/orgs/${org}/teams`, { id: "eng", name: "Eng" });
    const log = memLogger();
    const app = express();
    app.set("env", "development");
    const handler: express.RequestHandler = (_req, res) => void res.json({ ok: true });
    app.get("/user", checkMiddleware(new QuotaplaneClient({ baseUrl: stack.baseUrl, key }), { logger: log.logger, check: (req: express.Request) => ({ org, user: req.get("X-User") }) }), handler);
    // https to the api's plain port: a configuration error, not a fail-open.
    const tls = new QuotaplaneClient({ baseUrl: stack.baseUrl.replace("http:", "https:"), key, failPolicy: "open" });
    app.get("/tls", checkMiddleware(tls, { logger: log.logger, check: () => ({ org }) }), handler);
    const srv = await serve(app);
    try {
      const res = await fetch(`${srv.url}/user`, { headers: { "X-User": "nobody" } });
      const text = await res.text();
      assert.equal(res.status, 403, text);
      assert.equal(res.headers.get("Content-Type"), "application/problem+json");
      assert.doesNotMatch(text, /<html|<pre>/i);
      assert.equal((JSON.parse(text) as { quota_status: number }).quota_status, 400);
      assert.equal(log.warn.length, 1);
      assert.match(log.warn[0]!, /not registered/);

      const bad = await fetch(`${srv.url}/tls`);
      assert.equal(bad.status, 500);
      assert.equal(bad.headers.get("Content-Type"), "application/problem+json");
      assert.deepEqual(await bad.json(), {
        type: "https://quotaplane.dev/problems/quota-misconfigured",
        title: "Internal Server Error",
        status: 500,
        detail: "this service cannot reach the quota service as configured",
      });
      assert.equal(log.error.length, 1);
      assert.match(log.error[0]!, /configuration/);
    } finally {
      await srv.close();
    }
  });

  it("aborts the check when the client goes away, and answers nothing", async () => {
    const silent = await silentServer();
    try {
      const attempts: AttemptEvent[] = [];
      let handled = 0;
      const client = new QuotaplaneClient({ baseUrl: silent.url, key: "k", failPolicy: "open", budgetMs: 10_000, timeoutMs: 10_000, onAttempt: (e) => attempts.push(e) });
      const app = express();
      app.get("/", checkMiddleware(client, { check: () => ({ org: "acme" }) }), (_req, res) => {
        handled++;
        res.send("ok");
      });
      const srv = await serve(app);
      try {
        const ac = new AbortController();
        const pending = fetch(srv.url, { signal: ac.signal }).catch(() => "aborted");
        while (silent.connections === 0) await new Promise((r) => setTimeout(r, 10));
        const start = performance.now();
        ac.abort();
        assert.equal(await pending, "aborted");
        while (attempts.length === 0 && performance.now() - start < 3000) await new Promise((r) => setTimeout(r, 10));
        assert.equal(attempts.length, 1, "the check was not aborted");
        assert.ok(performance.now() - start < 1000, `aborted after ${Math.round(performance.now() - start)} ms`);
        assert.match(String((attempts[0]!.error as Error).message), /the client went away/);
        await new Promise((r) => setTimeout(r, 50));
        assert.equal(handled, 0, "the fail policy let a request of a client gone through");
      } finally {
        await srv.close();
      }
    } finally {
      await silent.close();
    }
  });
});

describe("reserveMiddleware options (issue 31)", () => {
  it("skip holds nothing, req.quotaplane carries the reservation to the handler, onDenied answers a denied reservation", async () => {
    const { org, key } = await stack.org({ limits: [{ metric: "tokens", window: "month", limit: 100 }] });
    const client = new QuotaplaneClient({ baseUrl: stack.baseUrl, key });
    const settled = nextSettled();
    const app = express();
    app.get(
      "/",
      reserveMiddleware(client, {
        skip: (req: express.Request) => req.query.free === "1",
        reserve: (req: express.Request) => ({ org, metric: "tokens", amount: Number(req.query.amount ?? 60) }),
        onDenied: (d, _req, res: express.Response) => void res.status(402).json({ operation: d.operation, decidedBy: d.decidedBy, allowed: d.allowed }),
        onSettled: settled.push,
      }),
      (req: express.Request, res) => {
        const d = req.quotaplane;
        res.json(d?.operation === "reserve" ? { id: d.reservation?.id, amount: d.reservation?.amount } : { skipped: d === undefined });
      },
    );
    const srv = await serve(app);
    try {
      assert.deepEqual(await (await fetch(`${srv.url}/?free=1`)).json(), { skipped: true });
      const held = (await (await fetch(srv.url)).json()) as { id: string; amount: number };
      assert.equal(held.amount, 60);
      const s = await settled.next();
      assert.equal(s.reservation?.id, held.id);
      assert.deepEqual([s.ending, s.result?.state], ["finished", "committed"]);
      const denied = await fetch(`${srv.url}/?amount=60`);
      assert.equal(denied.status, 402);
      assert.deepEqual(await denied.json(), { operation: "reserve", decidedBy: "quotaplane", allowed: false });
      assert.equal((await client.check({ org, metric: "tokens", cost: 0 })).result?.levels[0]?.used, 60, "the skipped request held or counted");
    } finally {
      await srv.close();
    }
  });
});

describe("reserveMiddleware settlement (issue 31)", () => {
  // The middleware settles when the handler ends, not on the response's 'close', which
  // fires when the client disconnects while the handler streams: what the stream
  // reports after the disconnect is counted, so no caller avoids paying by leaving.
  it("a client that disconnects mid-stream pays what the stream reported: settled when the handler ends, reportUsage adding", async () => {
    const { org, key } = await stack.org({ limits: [{ metric: "tokens", window: "month", limit: 1000 }] });
    const client = new QuotaplaneClient({ baseUrl: stack.baseUrl, key });
    const settled = nextSettled();
    let streamed: () => void = () => {};
    const streamDone = new Promise<void>((resolve) => (streamed = resolve));
    const app = express();
    app.get("/stream", reserveMiddleware(client, { reserve: () => ({ org, metric: "tokens", amount: 500 }), onSettled: settled.push }), async (_req, res) => {
      reportUsage(res, 10);
      res.write("first tokens\n");
      await new Promise((r) => setTimeout(r, 300)); // the model goes on; the client leaves meanwhile
      reportUsage(res, 80);
      res.write("more tokens\n");
      res.end();
      streamed();
    });
    const srv = await serve(app);
    try {
      const ac = new AbortController();
      const res = await fetch(`${srv.url}/stream`, { signal: ac.signal });
      const reader = res.body!.getReader();
      await reader.read(); // the first chunk came
      ac.abort();
      await reader.read().catch(() => undefined);
      const s = await settled.next();
      await streamDone;
      assert.equal(s.error, undefined, String(s.error));
      assert.deepEqual([s.result?.state, s.result?.used], ["committed", 90]);
      assert.equal(s.used, 90);
      assert.equal(s.ending, "disconnected");
      assert.equal((await client.check({ org, metric: "tokens", cost: 0 })).result?.levels[0]?.used, 90);
    } finally {
      await srv.close();
    }
  });

  it("a failed handler (next(err), 5xx) commits what it reported so far, and releases when it reported nothing", async () => {
    const { org, key } = await stack.org({ limits: [{ metric: "tokens", window: "month", limit: 1000 }] });
    const client = new QuotaplaneClient({ baseUrl: stack.baseUrl, key });
    const settled = nextSettled();
    const app = express();
    app.get("/fail", reserveMiddleware(client, { reserve: () => ({ org, metric: "tokens", amount: 100 }), onSettled: settled.push }), (req, res, next) => {
      if (req.query.used) reportUsage(res, Number(req.query.used));
      next(new Error("the model is down"));
    });
    app.use(errors);
    const srv = await serve(app);
    try {
      let total = 0;
      for (const [query, state, used] of [
        ["", "released", 0],
        ["?used=30", "committed", 30],
      ] as const) {
        const res = await fetch(`${srv.url}/fail${query}`);
        await res.text();
        assert.equal(res.status, 500);
        const s = await settled.next();
        assert.equal(s.error, undefined, String(s.error));
        assert.deepEqual([s.result?.state, s.result?.used], [state, used], query);
        assert.equal(s.ending, "failed");
        total += used;
        assert.equal((await client.check({ org, metric: "tokens", cost: 0 })).result?.levels[0]?.used, total, query);
      }
    } finally {
      await srv.close();
    }
  });

  it("a handler that never ends its response after the client left is settled after abandonAfterMs with what it reported", async () => {
    const { org, key } = await stack.org({ limits: [{ metric: "tokens", window: "month", limit: 1000 }] });
    const client = new QuotaplaneClient({ baseUrl: stack.baseUrl, key });
    const settled = nextSettled();
    const app = express();
    app.get("/", reserveMiddleware(client, { abandonAfterMs: 200, reserve: () => ({ org, metric: "tokens", amount: 100 }), onSettled: settled.push }), (_req, res) => {
      reportUsage(res, 7);
      res.write("partial\n"); // and never ends it
    });
    const srv = await serve(app);
    try {
      const ac = new AbortController();
      const res = await fetch(srv.url, { signal: ac.signal });
      await res.body!.getReader().read();
      const left = performance.now();
      ac.abort();
      const s = await settled.next();
      assert.ok(performance.now() - left >= 190, `settled ${Math.round(performance.now() - left)} ms after the client left, before abandonAfterMs`);
      assert.deepEqual([s.ending, s.result?.state, s.result?.used], ["abandoned", "committed", 7]);
    } finally {
      await srv.close();
    }
  });
});
