// concurrencyMiddleware in a real Express app, in front of a real quotaplane-api: the
// slot is given back on success, error, exception and client disconnect, refused when
// full, and decided by the fail policy when Quotaplane is down. The last describe
// needs a server with the `concurrent` window, `amounts` and POST
// /v1/reservations/{id}/extend; the others need only reservations.
import assert from "node:assert/strict";
import type { AddressInfo } from "node:net";
import type { Server } from "node:http";
import { after, before, describe, it } from "node:test";

import express, { type ErrorRequestHandler } from "express";

import { amountsOf, concurrencyMiddleware, QuotaplaneClient, reportUsage, reservationId, usedOf, type ReserveRequest, type Settled } from "../src/index.js";
import { freePort, Stack } from "./harness.js";

let stack: Stack;
before(async () => {
  stack = await Stack.start({ worker: true });
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
    close: () =>
      new Promise((resolve) => {
        srv.closeAllConnections();
        srv.close(() => resolve());
      }),
  };
}

/** A queue of values that tests await one by one. */
class Queue<T> {
  #items: T[] = [];
  #waiters: ((v: T) => void)[] = [];
  push(v: T): void {
    const w = this.#waiters.shift();
    if (w) w(v);
    else this.#items.push(v);
  }
  next(what: string, ms = 10_000): Promise<T> {
    const v = this.#items.shift();
    if (v !== undefined) return Promise.resolve(v);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no ${what} within ${ms} ms`)), ms);
      this.#waiters.push((x) => {
        clearTimeout(timer);
        resolve(x);
      });
    });
  }
  get length(): number {
    return this.#items.length;
  }
}

const quiet: ErrorRequestHandler = (err, _req, res, _next) => {
  res.status(500).json({ error: String(err) });
};

/**
 * An app whose routes hold a slot of `reserve`: /ok, /fail (next(err)), /throw, /async
 * (a rejected promise), /report (reports 1 used), /block (waits for let(), deaf to the
 * client), /stream (writes a chunk every 250 ms for streamMs).
 */
function slotApp(client: QuotaplaneClient, reserve: (req: express.Request) => ReserveRequest) {
  const started = new Queue<string>(); // reservation ids, as each handler starts
  const settled = new Queue<Settled>();
  const blocked: (() => void)[] = [];
  const waiting = new Queue<true>();
  let returned = 0;
  let streamMs = 0;
  const app = express();
  app.use(concurrencyMiddleware(client, { reserve, onSettled: (s) => settled.push(s) }));
  const id = (res: express.Response) => started.push(reservationId(res) ?? "");
  app.get("/ok", (_req, res) => {
    id(res);
    res.send("ok");
  });
  app.get("/fail", (_req, res, next) => {
    id(res);
    next(new Error("the model is down"));
  });
  app.get("/throw", (_req, res) => {
    id(res);
    throw new Error("handler bug");
  });
  app.get("/async", async (_req, res) => {
    id(res);
    await new Promise((r) => setTimeout(r, 10));
    throw new Error("async handler bug");
  });
  app.get("/report", (_req, res) => {
    id(res);
    reportUsage(res, 1);
    res.send("ok");
  });
  app.get("/block", async (_req, res) => {
    id(res);
    await new Promise<void>((r) => {
      blocked.push(r);
      waiting.push(true);
    });
    returned++;
    res.send("late"); // node lets a handler end a response whose client is gone
  });
  app.get("/stream", async (_req, res) => {
    id(res);
    for (const end = Date.now() + streamMs; Date.now() < end; ) {
      res.write("chunk\n");
      await new Promise((r) => setTimeout(r, 250));
    }
    res.end();
  });
  app.use(quiet);
  return {
    app,
    started,
    settled,
    waiting,
    returned: () => returned,
    let: () => blocked.shift()?.(),
    letAll: () => blocked.splice(0).forEach((r) => r()),
    setStream: (ms: number) => (streamMs = ms),
  };
}

async function minuteUsed(client: QuotaplaneClient, org: string): Promise<number | undefined> {
  return (await client.check({ org, metric: "requests", cost: 0 })).result?.levels.find((l) => l.window === "minute")?.used;
}

describe("concurrencyMiddleware", () => {
  it("gives the slot back on success, error, exception and async exception; commits what was reported", async () => {
    const { org, key } = await stack.org({ limits: [{ metric: "requests", window: "minute", limit: 3 }] });
    const client = new QuotaplaneClient({ baseUrl: stack.baseUrl, key });
    const a = slotApp(client, () => ({ org, metric: "requests", amount: 1, ttl_seconds: 10 }));
    const srv = await serve(a.app);
    try {
      let committed = 0;
      for (const [path, status, state] of [
        ["/ok", 200, "released"],
        ["/fail", 500, "released"],
        ["/throw", 500, "released"],
        ["/async", 500, "released"],
        ["/report", 200, "committed"],
      ] as const) {
        const res = await fetch(srv.url + path);
        await res.text();
        assert.equal(res.status, status, path);
        const id = await a.started.next("reservation id");
        assert.ok(id, `${path}: no reservation`);
        const s = await a.settled.next(`${path} settled`);
        assert.equal(s.reservation?.id, id);
        assert.equal(s.error, undefined, String(s.error));
        assert.equal(s.result?.state, state, path);
        assert.equal((await client.getReservation(id)).state, state, path);
        if (state === "committed") committed++;
        assert.equal(await minuteUsed(client, org), committed, `${path}: the minute window`);
      }
    } finally {
      await srv.close();
    }
  });

  // The slot stays held after the client goes away while the handler still runs, and
  // is settled when the handler is done, with what it reported after the disconnect.
  it("holds the slot while the handler runs after the client went away, and gives it back when the handler is done", async () => {
    const { org, key } = await stack.org({ limits: [{ metric: "requests", window: "minute", limit: 3 }] });
    const client = new QuotaplaneClient({ baseUrl: stack.baseUrl, key });
    const a = slotApp(client, () => ({ org, metric: "requests", amount: 1, ttl_seconds: 30 }));
    const srv = await serve(a.app);
    try {
      const ac = new AbortController();
      const pending = fetch(`${srv.url}/block`, { signal: ac.signal }).catch(() => "aborted");
      const id = await a.started.next("reservation id");
      await a.waiting.next("handler waiting");
      assert.equal((await client.getReservation(id)).state, "held");
      ac.abort();
      assert.equal(await pending, "aborted");
      await new Promise((r) => setTimeout(r, 200));
      assert.equal((await client.getReservation(id)).state, "held", "given back while the handler still ran");
      a.let();
      const s = await a.settled.next("settled after the handler");
      assert.equal(a.returned(), 1);
      assert.equal(s.ending, "disconnected");
      assert.equal(s.result?.state, "released");
      assert.equal((await client.getReservation(id)).state, "released");
      assert.equal(await minuteUsed(client, org), 0);
    } finally {
      a.letAll();
      await srv.close();
    }
  });

  it("answers 429 with Retry-After when every slot is held, and lets the next in once one is back", async () => {
    const { org, key } = await stack.org({ limits: [{ metric: "requests", window: "minute", limit: 2 }] });
    const client = new QuotaplaneClient({ baseUrl: stack.baseUrl, key });
    const a = slotApp(client, () => ({ org, metric: "requests", amount: 1 }));
    const srv = await serve(a.app);
    try {
      const holders = [fetch(`${srv.url}/block`), fetch(`${srv.url}/block`)];
      await a.waiting.next("first holder");
      await a.waiting.next("second holder");
      const denied = await fetch(`${srv.url}/ok`);
      assert.equal(denied.status, 429);
      assert.equal(denied.headers.get("Content-Type"), "application/problem+json");
      assert.match(denied.headers.get("Retry-After") ?? "", /^[1-9]\d*$/);
      const body = (await denied.json()) as { blocked_at?: { level: string } };
      assert.equal(body.blocked_at?.level, "org");
      assert.equal(a.started.length, 2, "the denied request reached the handler");
      a.letAll();
      for (const h of holders) assert.equal((await h).status, 200);
      await a.settled.next("first settled");
      await a.settled.next("second settled");
      assert.equal((await fetch(`${srv.url}/ok`)).status, 200);
    } finally {
      a.letAll();
      await srv.close();
    }
  });

  it("follows the fail policy when Quotaplane is down: closed answers 503, open runs the handler holding nothing", async () => {
    const dead = `http://127.0.0.1:${await freePort()}`;
    for (const [failPolicy, status] of [
      ["closed", 503],
      ["open", 200],
    ] as const) {
      const client = new QuotaplaneClient({ baseUrl: dead, key: "k", failPolicy, retries: 0, timeoutMs: 500 });
      const a = slotApp(client, () => ({ org: "acme", metric: "requests", amount: 1 }));
      const srv = await serve(a.app);
      try {
        const t0 = Date.now();
        const res = await fetch(`${srv.url}/ok`);
        await res.text();
        assert.ok(Date.now() - t0 < 5000, "Quotaplane down stalled the request");
        assert.equal(res.status, status, failPolicy);
        if (status === 503) assert.equal(res.headers.get("Retry-After"), "1");
        else assert.equal(await a.started.next("handler"), "", "fail open held a reservation");
      } finally {
        await srv.close();
      }
    }
  });
});

describe("concurrencyMiddleware with concurrent limits, amounts and extend (needs the merged server of issue 24)", () => {
  it("extends the slot of a stream that runs longer than its ttl", async () => {
    const { org, key } = await stack.org({ limits: [{ metric: "requests", window: "minute", limit: 10 }] });
    const client = new QuotaplaneClient({ baseUrl: stack.baseUrl, key });
    const a = slotApp(client, () => ({ org, metric: "requests", amount: 1, ttl_seconds: 2 }));
    a.setStream(5000);
    const srv = await serve(a.app);
    try {
      const pending = fetch(`${srv.url}/stream`)
        .then(async (r) => [r.status, await r.text()] as const)
        .catch((err: unknown) => [0, String(err)] as const);
      const id = await a.started.next("reservation id");
      await new Promise((r) => setTimeout(r, 3500)); // past the ttl, and a sweep
      const mid = await client.getReservation(id);
      assert.equal(mid.state, "held", "the slot expired under a running stream");
      assert.ok(Date.parse(mid.expires_at) > Date.now());
      const [status, body] = await pending;
      assert.equal(status, 200);
      assert.ok(body.split("chunk").length > 10);
      assert.equal((await a.settled.next("settled")).result?.state, "released");
    } finally {
      await srv.close();
    }
  });

  it("holds against a concurrent limit: in flight while running, 0 after; tokens settled with the real count", async () => {
    const { org, key } = await stack.org({
      limits: [
        { metric: "requests", window: "concurrent", limit: 2 },
        { metric: "tokens", window: "month", limit: 100000 },
      ],
    });
    const client = new QuotaplaneClient({ baseUrl: stack.baseUrl, key });
    const a = slotApp(client, () => ({ org, amounts: { requests: 1, tokens: 4000 } }));
    a.app.get("/llm", (_req, res) => {
      reportUsage(res, { requests: 1, tokens: 1234 });
      res.send("ok");
    });
    const srv = await serve(a.app);
    // What open reservations hold: the concurrent level's limit less its remaining.
    const inFlight = async () => {
      const l = (await client.check({ org, costs: { requests: 0, tokens: 0 } })).result?.levels.find((l) => l.window === "concurrent");
      return l && l.limit - l.remaining;
    };
    try {
      const holders = [fetch(`${srv.url}/block`), fetch(`${srv.url}/block`)];
      await a.waiting.next("first holder");
      await a.waiting.next("second holder");
      assert.equal(await inFlight(), 2);
      const denied = await fetch(`${srv.url}/ok`);
      assert.equal(denied.status, 429);
      assert.equal(((await denied.json()) as { blocked_at?: { window: string } }).blocked_at?.window, "concurrent");
      a.letAll();
      await Promise.all(holders);
      await a.settled.next("first settled");
      await a.settled.next("second settled");
      assert.equal(await inFlight(), 0);
      // /llm is registered after the slot app's catch-all error handler: it still runs under the middleware.
      assert.equal((await fetch(`${srv.url}/llm`)).status, 200);
      const s = await a.settled.next("/llm settled");
      assert.equal(s.result?.state, "committed");
      assert.deepEqual(usedOf(s.result!), { requests: 1, tokens: 1234 });
      const tokens = (await client.check({ org, metric: "tokens", cost: 0 })).result?.levels.find((l) => l.window === "month")?.used;
      assert.equal(tokens, 1234);
      assert.equal(await inFlight(), 0);
    } finally {
      a.letAll();
      await srv.close();
    }
  });

  it("client: costs all or nothing, amounts settled per metric, extend", async () => {
    const { org, key } = await stack.org({
      limits: [
        { metric: "requests", window: "minute", limit: 50 },
        { metric: "tokens", window: "month", limit: 1000 },
      ],
    });
    const client = new QuotaplaneClient({ baseUrl: stack.baseUrl, key });
    const denied = await client.check({ org, costs: { requests: 1, tokens: 2000 } });
    assert.equal(denied.allowed, false);
    assert.equal(denied.result?.blocked_at?.metric, "tokens");
    assert.equal(await minuteUsed(client, org), 0, "a denied check counted a request");
    const ok = await client.check({ org, costs: { requests: 1, tokens: 100 } });
    assert.equal(ok.allowed, true);
    assert.deepEqual(new Set(ok.result?.levels.map((l) => l.metric)), new Set(["requests", "tokens"]));

    const out = await client.reserve({ org, amounts: { requests: 1, tokens: 400 }, ttl_seconds: 10 });
    const r = out.reservation!;
    assert.deepEqual(amountsOf(r), { requests: 1, tokens: 400 });
    const ext = await client.extend(r.id, 120);
    assert.ok(Date.parse(ext.expires_at) > Date.now() + 100_000);
    const done = await client.commit(r.id, { requests: 1, tokens: 123 });
    assert.equal(done.state, "committed");
    assert.deepEqual(usedOf(done), { requests: 1, tokens: 123 });
    const tokens = (await client.check({ org, metric: "tokens", cost: 0 })).result?.levels.find((l) => l.window === "month")?.used;
    assert.equal(tokens, 223);
  });
});
