// The test kit (@quotaplane/client/testing) as a user's tests use it: an Express app's
// handlers tested with FakeQuotaplane, and with an object of the test's own, no api.
import assert from "node:assert/strict";
import type { AddressInfo } from "node:net";
import type { Server } from "node:http";
import { describe, it } from "node:test";

import express from "express";

import { checkMiddleware, concurrencyMiddleware, QuotaplaneError, reportUsage, reservationId, type CheckOutcome, type Quotaplane } from "../src/index.js";
import { FakeQuotaplane, noopQuotaplane } from "../src/testing.js";

async function serve(app: express.Express): Promise<{ url: string; close: () => Promise<void> }> {
  const srv: Server = await new Promise((resolve) => {
    const s = app.listen(0, "127.0.0.1", () => resolve(s));
  });
  return { url: `http://127.0.0.1:${(srv.address() as AddressInfo).port}`, close: () => new Promise((resolve) => srv.close(() => resolve())) };
}

// The user's app: /search is 10 a month per user of team eng; its handler reads the decision.
function userApp(quota: Pick<Quotaplane, "check">) {
  const app = express();
  app.get(
    "/search",
    checkMiddleware(quota, { logger: { warn: () => {}, error: () => {} }, check: (req: express.Request) => ({ org: "acme", team: "eng", user: req.get("X-User"), cost: Number(req.query.cost ?? 1) }) }),
    (req: express.Request, res) => void res.json({ results: [], remaining: req.quotaplane?.rateLimit?.remaining ?? null }),
  );
  return app;
}

describe("the test kit", () => {
  it("tests a user's Express handler without an api: allowed, denied (429 problem), refused (a user not registered: 403 problem)", async () => {
    const quota = new FakeQuotaplane({ limit: 10 });
    const srv = await serve(userApp(quota));
    try {
      const ok = await fetch(`${srv.url}/search?cost=6`, { headers: { "X-User": "alice" } });
      assert.deepEqual([ok.status, await ok.json()], [200, { results: [], remaining: null }]);
      const denied = await fetch(`${srv.url}/search?cost=6`, { headers: { "X-User": "alice" } });
      assert.equal(denied.status, 429);
      assert.equal(denied.headers.get("Content-Type"), "application/problem+json");
      assert.equal(((await denied.json()) as { status: number }).status, 429);
      assert.equal(quota.used({ org: "acme", team: "eng", user: "alice" }), 6);
      assert.deepEqual(
        quota.calls.map((c) => c.operation === "check" && [c.request.user, c.request.cost]),
        [
          ["alice", 6],
          ["alice", 6],
        ],
      );
    } finally {
      await srv.close();
    }

    const strict = new FakeQuotaplane({
      decide: (req) =>
        req.user === "mallory" ? new QuotaplaneError(400, { type: "https://quotaplane.dev/problems/bad-request", title: "Bad Request", status: 400, detail: 'user "mallory" is not registered' }) : true,
    });
    const srv2 = await serve(userApp(strict));
    try {
      const res = await fetch(`${srv2.url}/search`, { headers: { "X-User": "mallory" } });
      assert.equal(res.status, 403);
      assert.equal(res.headers.get("Content-Type"), "application/problem+json");
      assert.match(((await res.json()) as { detail: string }).detail, /not registered/);
    } finally {
      await srv2.close();
    }
  });

  it("the middleware takes any object with the methods it uses (no class with private fields to extend)", async () => {
    const rateLimit = { limit: 5, remaining: 4, reset: 60 };
    const mine = { check: async (): Promise<CheckOutcome> => ({ allowed: true, decidedBy: "quotaplane", idempotencyKey: "k-00000001", rateLimit }) };
    const srv = await serve(userApp(mine));
    try {
      const res = await fetch(`${srv.url}/search`, { headers: { "X-User": "bob" } });
      assert.deepEqual([res.status, res.headers.get("RateLimit-Remaining"), await res.json()], [200, "4", { results: [], remaining: 4 }]);
    } finally {
      await srv.close();
    }
  });

  it("concurrencyMiddleware against the fake: a slot held while the handler runs, committed with what it reported", async () => {
    const quota = new FakeQuotaplane({ limit: 1 });
    const app = express();
    let release: () => void = () => {};
    app.get("/slow", concurrencyMiddleware(quota, { reserve: () => ({ org: "acme", amount: 1 }) }), async (_req, res) => {
      await new Promise<void>((r) => (release = r));
      reportUsage(res, 1);
      res.send(reservationId(res));
    });
    const srv = await serve(app);
    try {
      const first = fetch(`${srv.url}/slow`);
      while (quota.reservations.size === 0) await new Promise((r) => setTimeout(r, 5));
      assert.equal((await fetch(`${srv.url}/slow`)).status, 429, "the second request got a slot");
      release();
      const id = await (await first).text();
      while (quota.reservations.get(id)?.state === "held") await new Promise((r) => setTimeout(r, 5));
      assert.equal(quota.reservations.get(id)?.state, "committed");
    } finally {
      await srv.close();
    }
  });

  it("noopQuotaplane allows everything", async () => {
    const srv = await serve(userApp(noopQuotaplane()));
    try {
      for (let i = 0; i < 3; i++) assert.equal((await fetch(`${srv.url}/search?cost=1000000`, { headers: { "X-User": "x" } })).status, 200);
    } finally {
      await srv.close();
    }
  });
});
