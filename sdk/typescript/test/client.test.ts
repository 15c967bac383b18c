// QuotaplaneClient against a real quotaplane-api: decisions and their headers, the
// errors, retries that count once, and the fail policies.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { QuotaplaneAbortError, QuotaplaneClient, QuotaplaneError, QuotaplaneUnavailableError, type FailContext } from "../src/index.js";
import { freePort, Stack, withoutMetric } from "./harness.js";
import { lossyProxy, silentServer } from "./proxy.js";

let stack: Stack;
before(async () => {
  stack = await Stack.start();
});
after(async () => {
  await stack?.stop();
});

describe("check", () => {
  it("allows until the limit, then denies, with the RateLimit headers and Retry-After mapped", async () => {
    const { org, key } = await stack.org({ limits: [{ metric: "requests", window: "minute", limit: 3 }] });
    const client = new QuotaplaneClient({ baseUrl: stack.baseUrl, key });
    for (const remaining of [2, 1, 0]) {
      const out = await client.check({ org });
      assert.equal(out.allowed, true);
      assert.equal(out.decidedBy, "quotaplane");
      assert.equal(out.result?.mode, "enforce");
      assert.deepEqual(
        out.result?.levels.map((l) => [l.level, l.id, l.window, l.limit, l.used, l.remaining]),
        [["org", org, "minute", 3, 3 - remaining, remaining]],
      );
      assert.equal(out.rateLimit?.limit, 3);
      assert.equal(out.rateLimit?.remaining, remaining);
      assert.equal(out.rateLimit?.policy, "org-minute", "the draft-11 RateLimit field names the tightest policy");
      assert.deepEqual(out.policies, [{ name: "org-minute", quota: 3, window: 60 }]);
      assert.ok(out.rateLimit!.reset >= 0 && out.rateLimit!.reset <= 63, `reset ${out.rateLimit?.reset}`);
      assert.equal(out.retryAfterSeconds, undefined);
      assert.match(out.idempotencyKey, /^[A-Za-z0-9._:@-]{8,128}$/);
    }
    const denied = await client.check({ org });
    assert.equal(denied.allowed, false);
    assert.equal(denied.decidedBy, "quotaplane");
    assert.deepEqual(withoutMetric(denied.result?.blocked_at), { level: "org", id: org, window: "minute" });
    assert.ok(denied.retryAfterSeconds! >= 1, `retry after ${denied.retryAfterSeconds}`);
    assert.equal(denied.retryAfterSeconds, denied.result?.retry_after_seconds);
    assert.deepEqual(denied.rateLimit, { limit: 3, remaining: 0, reset: denied.retryAfterSeconds, policy: "org-minute" });
    assert.deepEqual(denied.result?.["violated-policies"], ["org-minute"]);
    // A denial counts nothing.
    const probe = await client.check({ org, cost: 0 });
    assert.equal(probe.result?.levels[0]?.used, 3);
  });

  it("throws QuotaplaneError with the problem document when Quotaplane refuses the request", async () => {
    const { org, key } = await stack.org({ limits: [{ metric: "requests", window: "minute", limit: 10 }] });
    const client = new QuotaplaneClient({ baseUrl: stack.baseUrl, key });
    const unknown = await client.check({ org, metric: "request" }).then(
      () => assert.fail("an unknown metric was accepted"),
      (e: unknown) => e,
    );
    assert.ok(unknown instanceof QuotaplaneError, String(unknown));
    assert.equal(unknown.status, 422);
    assert.equal(unknown.problem.status, 422);
    assert.equal(unknown.problem.type, "https://quotaplane.dev/problems/unprocessable-entity");
    assert.equal(unknown.problem.errors?.[0]?.field, "metric");
    assert.match(unknown.message, /unknown metric "request"/);

    const badKey = new QuotaplaneClient({ baseUrl: stack.baseUrl, key: "qpk_nope_nope" });
    await assert.rejects(badKey.check({ org }), (e: unknown) => e instanceof QuotaplaneError && e.status === 401 && e.problem.status === 401);

    const invalid = await client.check({ org, cost: -1 }).catch((e: unknown) => e);
    assert.ok(invalid instanceof QuotaplaneError && invalid.status === 400, String(invalid));
    assert.ok(invalid.problem.errors?.some((f) => f.field === "cost"), JSON.stringify(invalid.problem));
  });

  it("replays the decision for a repeated idempotency key the caller gave", async () => {
    const { org, key } = await stack.org({ limits: [{ metric: "requests", window: "month", limit: 100 }] });
    const client = new QuotaplaneClient({ baseUrl: stack.baseUrl, key });
    const first = await client.check({ org, cost: 7, idempotency_key: "order-12345" });
    const again = await client.check({ org, cost: 7, idempotency_key: "order-12345" });
    assert.equal(first.idempotencyKey, "order-12345");
    assert.equal(first.result?.replayed, undefined);
    assert.equal(again.result?.replayed, true);
    assert.equal((await client.check({ org, cost: 0 })).result?.levels[0]?.used, 7);
  });
});

describe("checkBatch", () => {
  // An item the api refused (4xx) is an error, not a denial (`allowed: false`).
  it("decides each check on its own, in order, and hands back the refused one as an error, not a denial", async () => {
    const { org, key } = await stack.org({ limits: [{ metric: "requests", window: "minute", limit: 2 }] });
    const client = new QuotaplaneClient({ baseUrl: stack.baseUrl, key });
    const out = await client.checkBatch([{ org }, { org, metric: "nope" }, { org }, { org }]);
    assert.deepEqual(
      out.map((o) => [o.allowed, o.decidedBy, o.error?.status]),
      [
        [true, "quotaplane", undefined],
        [undefined, undefined, 422],
        [true, "quotaplane", undefined],
        [false, "quotaplane", undefined],
      ],
    );
    assert.deepEqual(out[0]?.rateLimit?.remaining, 1);
    assert.deepEqual(withoutMetric(out[3]?.result?.blocked_at), { level: "org", id: org, window: "minute" });
    assert.deepEqual(out[3]?.rateLimit, { limit: 2, remaining: 0, reset: out[3]?.retryAfterSeconds });
    assert.equal(new Set(out.map((o) => o.idempotencyKey)).size, 4);
  });
});

describe("retries", () => {
  it("a lost reply, retried, counts once: the retry reuses the generated idempotency key", async () => {
    const { org, key } = await stack.org({ limits: [{ metric: "requests", window: "month", limit: 100 }] });
    const proxy = await lossyProxy(new URL(stack.baseUrl).host, 1);
    try {
      const client = new QuotaplaneClient({ baseUrl: proxy.url, key, retries: 2 });
      const out = await client.check({ org, cost: 5 });
      assert.equal(out.allowed, true);
      assert.equal(out.decidedBy, "quotaplane");
      assert.equal(out.result?.replayed, true, "the retry was not answered as a replay");
      assert.equal(proxy.connections, 2);
      const direct = new QuotaplaneClient({ baseUrl: stack.baseUrl, key });
      assert.equal((await direct.check({ org, cost: 0 })).result?.levels[0]?.used, 5);
    } finally {
      await proxy.close();
    }
  });

  it("a lost reply of a batch, retried, counts each check once", async () => {
    const { org, key } = await stack.org({ limits: [{ metric: "requests", window: "month", limit: 100 }] });
    const proxy = await lossyProxy(new URL(stack.baseUrl).host, 1);
    try {
      const client = new QuotaplaneClient({ baseUrl: proxy.url, key, retries: 1 });
      const out = await client.checkBatch([{ org, cost: 2 }, { org, cost: 3 }]);
      assert.deepEqual(out.map((o) => [o.allowed, o.result?.replayed]), [[true, true], [true, true]]);
      const direct = new QuotaplaneClient({ baseUrl: stack.baseUrl, key });
      assert.equal((await direct.check({ org, cost: 0 })).result?.levels[0]?.used, 5);
    } finally {
      await proxy.close();
    }
  });

  it("an abort by the caller is thrown (QuotaplaneAbortError), not handed to the fail policy", async () => {
    const silent = await silentServer();
    try {
      const client = new QuotaplaneClient({ baseUrl: silent.url, key: "k", failPolicy: "open", timeoutMs: 5000, budgetMs: 5000 });
      const ac = new AbortController();
      setTimeout(() => ac.abort(new Error("caller gave up")), 100);
      await assert.rejects(client.check({ org: "x" }, { signal: ac.signal }), (e: unknown) => e instanceof QuotaplaneAbortError && /caller gave up/.test(e.message));
    } finally {
      await silent.close();
    }
  });
});

describe("fail policies", () => {
  const policies = [
    ["open", true],
    ["closed", false],
  ] as const;

  it("Quotaplane unreachable: open allows, closed denies, and neither is Quotaplane's decision", async () => {
    const dead = `http://127.0.0.1:${await freePort()}`;
    for (const [policy, allowed] of policies) {
      const client = new QuotaplaneClient({ baseUrl: dead, key: "k", failPolicy: policy, retries: 2, retryDelayMs: 1 });
      const out = await client.check({ org: "acme", user: "alice" });
      assert.equal(out.allowed, allowed, policy);
      assert.equal(out.decidedBy, "fail-policy");
      assert.equal(out.result, undefined);
      assert.ok(out.unavailable instanceof QuotaplaneUnavailableError);
      assert.equal(out.unavailable.attempts, 3);
      assert.equal(out.unavailable.status, undefined);
      assert.match(out.unavailable.message, /unreachable/);
    }
  });

  it("Quotaplane unreachable, and no fail policy: check, checkBatch and reserve throw QuotaplaneUnavailableError", async () => {
    const dead = `http://127.0.0.1:${await freePort()}`;
    const client = new QuotaplaneClient({ baseUrl: dead, key: "k", retries: 1, retryDelayMs: 1 });
    for (const call of [() => client.check({ org: "acme" }), () => client.checkBatch([{ org: "acme" }]), () => client.reserve({ org: "acme", amount: 1 })]) {
      await assert.rejects(call(), (e: unknown) => e instanceof QuotaplaneUnavailableError && e.attempts === 2 && e.status === undefined);
    }
  });

  it("Quotaplane unreachable: a policy function decides from the request, and its error reaches the caller", async () => {
    const dead = `http://127.0.0.1:${await freePort()}`;
    const seen: FailContext[] = [];
    const client = new QuotaplaneClient({
      baseUrl: dead,
      key: "k",
      retries: 0,
      failPolicy: async (ctx) => {
        seen.push(ctx);
        return (ctx.request as { user?: string }).user === "vip";
      },
    });
    assert.equal((await client.check({ org: "acme", user: "vip" })).allowed, true);
    const other = await client.check({ org: "acme", user: "bob", idempotency_key: "bob-00000001" });
    assert.equal(other.allowed, false);
    assert.equal(other.decidedBy, "fail-policy");
    assert.deepEqual(
      seen.map((c) => [c.operation, (c.request as { user?: string }).user, c.error.attempts]),
      [
        ["check", "vip", 1],
        ["check", "bob", 1],
      ],
    );
    assert.equal(seen[1]?.request.idempotency_key, "bob-00000001");

    const throwing = new QuotaplaneClient({ baseUrl: dead, key: "k", retries: 0, failPolicy: () => { throw new Error("no quota service"); } });
    await assert.rejects(throwing.check({ org: "acme" }), /no quota service/);
  });

  it("Quotaplane hangs: each attempt times out, then the fail policy answers", async () => {
    const silent = await silentServer();
    try {
      for (const [policy, allowed] of policies) {
        const client = new QuotaplaneClient({ baseUrl: silent.url, key: "k", failPolicy: policy, timeoutMs: 150, retries: 1, retryDelayMs: 1 });
        const out = await client.check({ org: "acme" });
        assert.equal(out.allowed, allowed);
        assert.equal(out.decidedBy, "fail-policy");
        assert.equal(out.unavailable?.attempts, 2);
        assert.equal((out.unavailable?.cause as Error | undefined)?.name, "TimeoutError");
      }
      assert.ok(silent.connections >= 4, `${silent.connections} connections`);
    } finally {
      await silent.close();
    }
  });

  it("Quotaplane answers 503 (Redis down under a closed plan): each policy answers, retried first", async () => {
    const { org, key } = await stack.org({ failMode: "closed", limits: [{ metric: "requests", window: "minute", limit: 10 }] });
    const open = await stack.org({ failMode: "open", limits: [{ metric: "requests", window: "minute", limit: 10 }] });
    // The same database, a Redis where nothing listens.
    const down = await stack.startAPI({ REDIS_URL: `redis://127.0.0.1:${await freePort()}/0`, QUOTA_REDIS_TIMEOUT: "100ms" });
    for (const [policy, allowed] of policies) {
      // Its Retry-After (1 s) goes beyond what is left of the 1 s budget: answered at once.
      const client = new QuotaplaneClient({ baseUrl: down.baseUrl, key, failPolicy: policy, retries: 1, maxRetryDelayMs: 20 });
      const out = await client.check({ org });
      assert.equal(out.allowed, allowed, policy);
      assert.equal(out.decidedBy, "fail-policy");
      assert.equal(out.unavailable?.status, 503);
      assert.equal(out.unavailable?.problem?.status, 503);
      assert.equal(out.unavailable?.retryAfterSeconds, 1);
      assert.equal(out.unavailable?.attempts, 1);
    }
    const fn = new QuotaplaneClient({ baseUrl: down.baseUrl, key, retries: 0, failPolicy: (ctx) => ctx.error.status === 503 });
    assert.deepEqual([(await fn.check({ org })).allowed, (await fn.check({ org })).decidedBy], [true, "fail-policy"]);

    const batch = await new QuotaplaneClient({ baseUrl: down.baseUrl, key, failPolicy: "closed" }).checkBatch([{ org }, { org, cost: 0 }]);
    assert.deepEqual(batch.map((o) => [o.allowed, o.decidedBy, o.unavailable?.status]), [[false, "fail-policy", 503], [false, "fail-policy", 503]]);

    // A plan that fails open is Quotaplane's own decision: allowed, flagged degraded.
    const degraded = await new QuotaplaneClient({ baseUrl: down.baseUrl, key: open.key, failPolicy: "closed" }).check({ org: open.org });
    assert.deepEqual([degraded.allowed, degraded.decidedBy, degraded.result?.degraded], [true, "quotaplane", true]);
  });

  it("Quotaplane unreachable: the fail policy answers a reservation, holding nothing", async () => {
    const dead = `http://127.0.0.1:${await freePort()}`;
    for (const [policy, allowed] of [["open", true], ["closed", false]] as const) {
      const client = new QuotaplaneClient({ baseUrl: dead, key: "k", failPolicy: policy, retries: 0 });
      const out = await client.reserve({ org: "acme", amount: 10 });
      assert.deepEqual([out.allowed, out.decidedBy, out.reservation], [allowed, "fail-policy", undefined]);
      assert.equal(out.unavailable?.attempts, 1);
    }
  });
});
