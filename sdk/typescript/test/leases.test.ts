// Client leases and coalescing (API.md "Client leases", issue 43): the rules a client
// keeps, held against a scripted server that answers slowly (the local deadline, exact
// settlement, one unsettled lease per path, close), then against a real quotaplane-api
// (a hot path leased and counted exactly, an org with client leases off, 1,000
// concurrent cold checks coalesced).
import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, it } from "node:test";

import { Client, QuotaplaneClient, QuotaplaneError, type CheckOutcome, type LeaseEvent } from "../src/index.js";
import { Stack } from "./harness.js";

// countingFetch counts the requests a client sends, per path.
function countingFetch(): { fetch: typeof fetch; count: Map<string, number>; total(): number } {
  const count = new Map<string, number>();
  return {
    count,
    total: () => [...count.values()].reduce((a, b) => a + b, 0),
    fetch: (input, init) => {
      const path = new URL(String(input)).pathname.replace(/^\/v1\/leases\/[^/]+\/settle$/, "/v1/leases/{id}/settle");
      count.set(path, (count.get(path) ?? 0) + 1);
      return fetch(input, init);
    },
  };
}

interface FakeLease {
  id: string;
  units: number;
  arrived: number; // performance.now() when the request that took it arrived
  ttlMs: number;
  settled?: { used: number; at: number; renew: boolean };
  lost?: boolean; // granted by a settle whose answer the server dropped
  settles: { used: number; renew: boolean }[]; // every settle request, repeats too
}

// leaseServer stands for Quotaplane's lease endpoints as the contract states them,
// answering each lease request `delayMs` late (so a client that started a lease's life
// at the answer would admit past it), with `units` units for `ttlMs`. Checks are allowed.
// With loseFirstRenew, the first renewing settle is carried out (the lease settled, the
// next one taken) and its answer lost: the connection is closed without one.
async function leaseServer(opts: { units: number; ttlMs: number; delayMs: number; loseFirstRenew?: boolean }) {
  const leases = new Map<string, FakeLease>();
  const violations: string[] = [];
  let checks = 0;
  let n = 0;
  let lost = false;
  const grant = (arrived: number) => {
    const open = [...leases.values()].filter((l) => !l.settled && !l.lost);
    if (open.length > 0) violations.push(`a lease was asked for while ${open.map((l) => l.id).join(", ")} was unsettled`);
    const l: FakeLease = { id: `lease-${++n}`, units: opts.units, arrived, ttlMs: opts.ttlMs, settles: [] };
    leases.set(l.id, l);
    const now = Date.now();
    return { id: l.id, units: l.units, ttl_ms: l.ttlMs, expires_at: new Date(now + l.ttlMs).toISOString(), settle_by: new Date(now + l.ttlMs + 5000).toISOString(), levels: [] };
  };
  const srv = createServer((req: IncomingMessage, res: ServerResponse) => {
    const arrived = performance.now();
    let text = "";
    req.on("data", (b: Buffer) => (text += b.toString()));
    req.on("end", () => {
      const body = text ? JSON.parse(text) : {};
      const answer = (status: number, out: unknown, delay = 0) =>
        setTimeout(() => {
          res.writeHead(status, { "Content-Type": "application/json" });
          res.end(JSON.stringify(out));
        }, delay);
      const url = req.url ?? "";
      if (url === "/v1/leases") return answer(201, grant(arrived), opts.delayMs);
      const m = /^\/v1\/leases\/([^/]+)\/settle$/.exec(url);
      if (m) {
        const l = leases.get(m[1]!);
        if (!l) return answer(404, { type: "about:blank", title: "Not Found", status: 404 });
        l.settles.push({ used: body.used, renew: body.renew === true });
        const repeat = l.settled !== undefined;
        if (!repeat) l.settled = { used: body.used, at: arrived, renew: body.renew === true };
        const next = body.renew && !repeat ? grant(arrived) : null; // a repeat takes no next lease
        if (next && opts.loseFirstRenew && !lost) {
          lost = true;
          leases.get(next.id)!.lost = true;
          return req.socket.destroy();
        }
        return answer(200, { settled: { used: l.settled!.used, released: l.units - l.settled!.used }, next }, body.renew ? opts.delayMs : 0);
      }
      if (url === "/v1/check") {
        checks++;
        return answer(200, { allowed: true, mode: "enforce", levels: [] });
      }
      answer(404, { type: "about:blank", title: "Not Found", status: 404 });
    });
  });
  await new Promise<void>((resolve) => srv.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(srv.address() as AddressInfo).port}`,
    leases,
    violations,
    get checks() {
      return checks;
    },
    close: () => new Promise<void>((resolve) => srv.close(() => resolve())),
  };
}

describe("client leases against a scripted server that answers late", () => {
  // Bound by time (a lease outlasts no ttl_ms from when it was asked for, however late
  // the answer came), then by units.
  for (const units of [1_000_000, 400]) it(`admit only before sent + ttl_ms and within units (${units}), settle exactly what they admitted, one at a time`, async () => {
    const srv = await leaseServer({ units, ttlMs: 500, delayMs: 120 });
    const client = new QuotaplaneClient({ baseUrl: srv.url, key: "k", leases: true, leaseThreshold: 20 });
    const admitted = new Map<string, number[]>(); // lease id -> performance.now() when each check it admitted was called
    // Until the third lease is taken (a loaded machine takes longer), at most 20 s.
    const end = performance.now() + 20_000;
    let sent = 0;
    while (performance.now() < end && srv.leases.size < 3) {
      // A check is admitted no earlier than it was called: what is recorded is a lower
      // bound of its admission (a pause before the caller resumes cannot fail the test).
      const called = performance.now();
      const out = await client.check({ org: "acme", user: "alice" });
      assert.equal(out.allowed, true);
      if (out.leased) {
        const id = out.idempotencyKey.slice(0, out.idempotencyKey.lastIndexOf(":"));
        (admitted.get(id) ?? admitted.set(id, []).get(id)!).push(called);
      } else sent++;
      if (sent % 8 === 0) await new Promise((r) => setImmediate(r)); // let answers in
    }
    await client.close();
    assert.deepEqual(srv.violations, []);
    assert.ok(srv.leases.size >= 2, `${srv.leases.size} leases taken`);
    let total = 0;
    for (const l of srv.leases.values()) {
      const at = admitted.get(l.id) ?? [];
      total += at.length;
      assert.ok(l.settled, `lease ${l.id} was never settled`);
      assert.equal(l.settled.used, at.length, `lease ${l.id} settled ${l.settled.used}, admitted ${at.length}`);
      assert.ok(at.length <= l.units, `lease ${l.id}: ${at.length} admitted of ${l.units}`);
      const last = Math.max(...at, -Infinity);
      // Its life began when the client sent the request, before it arrived here.
      assert.ok(last < l.arrived + l.ttlMs, `lease ${l.id} admitted ${(last - l.arrived - l.ttlMs).toFixed(1)} ms after arrival + ttl_ms`);
      assert.ok(l.settled.at <= l.arrived + l.ttlMs + 1000, `lease ${l.id} settled ${(l.settled.at - l.arrived - l.ttlMs).toFixed(0)} ms after its end`);
    }
    await srv.close();
    console.log(`scripted (${units} units a lease): ${total} checks leased from ${srv.leases.size} leases, ${srv.checks} sent one by one`);
    assert.ok(total > 0, `${total} leased, ${srv.checks} sent`);
  });

  it("sends a renewing settle once: when its answer is lost, settles again without renew and goes on leasing", async () => {
    const srv = await leaseServer({ units: 300, ttlMs: 900, delayMs: 0, loseFirstRenew: true });
    const client = new QuotaplaneClient({ baseUrl: srv.url, key: "k", leases: true, leaseThreshold: 5, retryDelayMs: 5 });
    const admitted = new Map<string, number>();
    const end = performance.now() + 20_000;
    while (performance.now() < end && srv.leases.size < 4) {
      const out = await client.check({ org: "acme", user: "dave" });
      if (out.leased) {
        const id = out.idempotencyKey.slice(0, out.idempotencyKey.lastIndexOf(":"));
        admitted.set(id, (admitted.get(id) ?? 0) + 1);
      }
      await new Promise((r) => setImmediate(r));
    }
    await client.close();
    assert.deepEqual(srv.violations, []);
    const first = srv.leases.get("lease-1")!;
    assert.deepEqual(first.settles, [
      { used: admitted.get("lease-1"), renew: true },
      { used: admitted.get("lease-1"), renew: false },
    ]);
    const lost = [...srv.leases.values()].filter((l) => l.lost);
    assert.equal(lost.length, 1);
    assert.equal(admitted.get(lost[0]!.id), undefined, "nothing admitted from the lease whose answer was lost");
    for (const l of srv.leases.values()) if (!l.lost) assert.equal(l.settled?.used, admitted.get(l.id) ?? 0, l.id);
    assert.ok(srv.leases.size >= 4, "leasing went on");
    await srv.close();
  });

  it("close settles an open lease and one still being taken, and stops leasing", async () => {
    const srv = await leaseServer({ units: 1000, ttlMs: 900, delayMs: 50 });
    const events: LeaseEvent[] = [];
    const client = new Client({ baseUrl: srv.url, key: "k", leases: true, leaseThreshold: 5, onLease: (e) => events.push(e) });
    let leased = 0;
    for (let i = 0; i < 200 && leased < 10; i++) {
      const out = await client.check({ org: "acme", user: "bob", metric: "tokens", cost: 2 });
      if (out.leased) leased++;
    }
    assert.equal(leased, 10, "the path was leased");
    await client.close();
    for (const l of srv.leases.values()) assert.ok(l.settled && !l.settled.renew, `lease ${l.id}: ${JSON.stringify(l.settled)}`);
    assert.equal([...srv.leases.values()].reduce((a, l) => a + (l.settled?.used ?? 0), 0), 20, "20 units admitted, 20 settled");
    const out = await client.check({ org: "acme", user: "bob", metric: "tokens", cost: 2 });
    assert.equal(out.leased, undefined, "no lease after close");
    assert.ok(events.some((e) => e.event === "settled"), JSON.stringify(events));
    await srv.close();
  });

  it("never leases queries, several metrics, or a check with the caller's idempotency key", async () => {
    const srv = await leaseServer({ units: 1000, ttlMs: 900, delayMs: 0 });
    const client = new QuotaplaneClient({ baseUrl: srv.url, key: "k", leases: true, leaseThreshold: 0 });
    const kinds = [{ cost: 0 }, { costs: { requests: 1, tokens: 5 } }, { idempotency_key: "order-1234" }];
    for (let i = 0; i < 300; i++) {
      const out = await client.check({ org: "acme", user: "carol", ...kinds[i % 3]! });
      assert.equal(out.leased, undefined);
    }
    assert.equal(srv.leases.size, 0);
    assert.equal(srv.checks, 300);
    await client.close();
    await srv.close();
  });
});

describe("client leases and coalescing against quotaplane-api", () => {
  let stack: Stack;
  before(async () => {
    stack = await Stack.start({ worker: true });
  });
  after(async () => {
    await stack?.stop();
  });

  it("coalesces 1,000 concurrent cold checks into at most 20 requests, each answered as its own", async () => {
    const { org, key } = await stack.org({ limits: [{ metric: "requests", window: "month", limit: 1_000_000 }] });
    await stack.api_("POST", `/v1/orgs/${org}/teams`, { id: "eng", name: "eng", user_limits: [{ metric: "requests", window: "month", limit: 1 }] });
    const counting = countingFetch();
    const client = new QuotaplaneClient({ baseUrl: stack.baseUrl, key, batchWaitMs: 5, fetch: counting.fetch, failPolicy: "closed" });
    // 475 users checked twice (one allowed, one denied each), and 50 checks of a metric
    // the plan does not know (each a 422 of its own), in a shuffled order.
    const reqs: { user: string; metric?: string }[] = [];
    for (let u = 0; u < 475; u++) reqs.push({ user: `u${u}` }, { user: `u${u}` });
    for (let u = 0; u < 50; u++) reqs.push({ user: `x${u}`, metric: "nope" });
    for (let i = reqs.length - 1; i > 0; i--) {
      const j = Math.floor(Math.random() * (i + 1));
      [reqs[i], reqs[j]] = [reqs[j]!, reqs[i]!];
    }
    const outs = await Promise.allSettled(reqs.map((r) => client.check({ org, team: "eng", ...r })));
    const allowed = new Map<string, number>();
    let denied = 0;
    outs.forEach((o, i) => {
      const r = reqs[i]!;
      if (r.metric === "nope") {
        assert.equal(o.status, "rejected", `check ${i} of an unknown metric`);
        const err = (o as PromiseRejectedResult).reason;
        assert.ok(err instanceof QuotaplaneError && err.status === 422, String(err));
        return;
      }
      assert.equal(o.status, "fulfilled", String((o as PromiseRejectedResult).reason));
      const out = (o as PromiseFulfilledResult<CheckOutcome>).value;
      assert.equal(out.decidedBy, "quotaplane", String(out.unavailable));
      const lvl = out.result!.levels.find((l) => l.level === "user");
      assert.equal(lvl?.id, r.user, "each caller gets its own check's answer");
      if (out.allowed) {
        allowed.set(r.user, (allowed.get(r.user) ?? 0) + 1);
        assert.equal(lvl?.used, 1);
      } else {
        denied++;
        assert.equal(out.result?.blocked_at?.level, "user");
        assert.equal(out.result?.blocked_at?.id, r.user);
      }
    });
    assert.equal(allowed.size, 475);
    assert.ok([...allowed.values()].every((n) => n === 1));
    assert.equal(denied, 475);
    console.log(`coalescing: 1000 concurrent checks in ${counting.total()} requests (${JSON.stringify(Object.fromEntries(counting.count))})`);
    assert.ok(counting.total() <= 20, `${counting.total()} requests`);
    await client.close();
  });

  it("leases a hot path: far fewer requests than checks, and counts exactly what it admitted once closed", async () => {
    const { org, key } = await stack.org({ limits: [{ metric: "requests", window: "month", limit: 10_000_000 }] });
    await stack.api_("POST", `/v1/orgs/${org}/teams`, { id: "eng", name: "eng", user_limits: [{ metric: "requests", window: "month", limit: 1_000_000 }] });
    const counting = countingFetch();
    const events: LeaseEvent[] = [];
    const client = new Client({ baseUrl: stack.baseUrl, key, leases: true, fetch: counting.fetch, onLease: (e) => events.push(e) });
    const n = 20_000;
    let leased = 0;
    const started = performance.now();
    for (let i = 0; i < n; i++) {
      const out = await client.check({ org, team: "eng", user: "hot" });
      assert.equal(out.allowed, true);
      if (out.leased) {
        leased++;
        assert.equal(out.decidedBy, "quotaplane");
        assert.ok(out.result!.levels.some((l) => l.level === "user" && l.id === "hot"));
      }
    }
    const ms = performance.now() - started;
    await client.close();
    const settled = events.filter((e) => e.event === "settled").reduce((s, e) => s + (e.used ?? 0), 0);
    const taken = events.filter((e) => e.event === "taken");
    console.log(
      `hot path: ${n} checks in ${ms.toFixed(0)} ms (${((n / ms) * 1000).toFixed(0)}/s), ${leased} leased, ${counting.total()} requests ` +
        `(${JSON.stringify(Object.fromEntries(counting.count))}), ${taken.length} leases of ${Math.min(...taken.map((e) => e.units!))} to ${Math.max(...taken.map((e) => e.units!))} units`,
    );
    assert.ok(leased >= n * 0.9, `${leased} of ${n} leased`);
    assert.ok(counting.total() <= n / 20, `${counting.total()} requests for ${n} checks`);
    assert.equal(settled, leased, "the leases settled exactly what they admitted");
    assert.ok(events.filter((e) => e.event === "taken").every((t) => events.some((s) => s.event === "settled" && s.id === t.id)), "every lease settled");
    const probe = new QuotaplaneClient({ baseUrl: stack.baseUrl, key });
    const counted = (await probe.check({ org, team: "eng", user: "hot", cost: 0 })).result!.levels.find((l) => l.level === "user")!.used;
    assert.equal(counted, n, "counted exactly what was admitted");
  });

  it("never leases a check of an org whose plan says client_leases off", async (t) => {
    const plan = `plan-off-${Math.random().toString(16).slice(2, 10)}`;
    const org = `org-off-${Math.random().toString(16).slice(2, 10)}`;
    try {
      await stack.api_("POST", "/v1/plans", { id: plan, name: plan, fail_mode: "closed", client_leases: "off", limits: [{ metric: "requests", window: "month", limit: 1_000_000 }] });
    } catch (err) {
      if (/client_leases/.test(String(err))) return t.skip(`the api does not know client_leases yet: ${err}`);
      throw err;
    }
    await stack.api_("POST", "/v1/orgs", { id: org, name: org, plan });
    const key = (await stack.api_("POST", `/v1/orgs/${org}/api-keys`, { name: "off", scopes: ["check"] })).secret as string;
    const events: LeaseEvent[] = [];
    const client = new QuotaplaneClient({ baseUrl: stack.baseUrl, key, leases: true, leaseThreshold: 10, onLease: (e) => events.push(e) });
    const end = performance.now() + 2500;
    let checks = 0;
    while (performance.now() < end) {
      const out = await client.check({ org });
      assert.equal(out.allowed, true);
      assert.equal(out.leased, undefined, "a check of a leases-off org was leased");
      checks++;
    }
    await client.close();
    const refused = events.filter((e) => e.event === "refused");
    console.log(`leases off: ${checks} checks, none leased; lease requests refused ${refused.length} times (${[...new Set(refused.map((e) => e.reason))].join(", ")})`);
    assert.ok(refused.length >= 1 && refused.every((e) => e.reason === "client_leases_off"), JSON.stringify(events.slice(0, 5)));
    assert.equal(events.filter((e) => e.event === "taken").length, 0);
  });
});
