// reserve, commit, release and getReservation against a real quotaplane-api, per
// API.md "Reservations". These need the reservations API (branch res): until it is
// merged, POST /v1/reservations answers 404 and they fail.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { QuotaplaneClient, QuotaplaneError } from "../src/index.js";
import { Stack, withoutMetric } from "./harness.js";
import { lossyProxy } from "./proxy.js";

let stack: Stack;
before(async () => {
  stack = await Stack.start();
});
after(async () => {
  await stack?.stop();
});

async function used(client: QuotaplaneClient, org: string): Promise<number | undefined> {
  return (await client.check({ org, metric: "tokens", cost: 0 })).result?.levels[0]?.used;
}

describe("reservations (needs the reservations API of branch res)", () => {
  it("reserve holds units against the limit, commit counts what was used and gives back the rest", async () => {
    const { org, key } = await stack.org({ limits: [{ metric: "tokens", window: "month", limit: 1000 }] });
    const client = new QuotaplaneClient({ baseUrl: stack.baseUrl, key });
    const out = await client.reserve({ org, metric: "tokens", amount: 600 });
    assert.equal(out.allowed, true);
    assert.equal(out.decidedBy, "quotaplane");
    const r = out.reservation!;
    assert.equal(r.state, "held");
    assert.equal(r.amount, 600);
    assert.equal(r.on_expiry, "commit");
    assert.ok(Date.parse(r.expires_at!) > Date.now());
    assert.deepEqual(r.levels?.map((l) => [l.level, l.id, l.window, l.limit]), [["org", org, "month", 1000]]);
    assert.deepEqual([out.rateLimit?.limit, out.rateLimit?.remaining], [1000, 400]);

    // Held units count as used ones: 600 held, 500 more do not fit.
    const denied = await client.reserve({ org, metric: "tokens", amount: 500 });
    assert.equal(denied.allowed, false);
    assert.equal(denied.decidedBy, "quotaplane");
    assert.equal(denied.reservation, undefined);
    assert.deepEqual(withoutMetric(denied.denied?.blocked_at), { level: "org", id: org, window: "month" });
    assert.ok(denied.retryAfterSeconds! >= 1);
    assert.equal((await client.check({ org, metric: "tokens", cost: 500 })).allowed, false);

    const committed = await client.commit(r.id, 250);
    assert.deepEqual([committed.id, committed.state, committed.amount, committed.used, committed.released], [r.id, "committed", 600, 250, 350]);
    assert.deepEqual(await client.commit(r.id, 250), committed, "a repeated commit answers the first commit");
    assert.equal((await client.getReservation(r.id)).state, "committed");
    assert.equal(await used(client, org), 250);
  });

  it("release gives everything back; a commit after it is a 409; another org's reservation is a 404", async () => {
    const { org, key } = await stack.org({ limits: [{ metric: "tokens", window: "month", limit: 1000 }] });
    const other = await stack.org({ limits: [{ metric: "tokens", window: "month", limit: 1000 }] });
    const client = new QuotaplaneClient({ baseUrl: stack.baseUrl, key });
    const { reservation } = await client.reserve({ org, metric: "tokens", amount: 300, ttl_seconds: 120, on_expiry: "release" });
    assert.equal(reservation?.on_expiry, "release");
    const released = await client.release(reservation!.id);
    assert.equal(released.state, "released");
    assert.equal(await used(client, org), 0);
    const conflict = await client.commit(reservation!.id, 10).catch((e: unknown) => e);
    assert.ok(conflict instanceof QuotaplaneError && conflict.status === 409, String(conflict));
    assert.match(conflict.problem.detail ?? "", /released/);

    const stranger = new QuotaplaneClient({ baseUrl: stack.baseUrl, key: other.key });
    await assert.rejects(stranger.getReservation(reservation!.id), (e: unknown) => e instanceof QuotaplaneError && e.status === 404);
  });

  it("a lost reply of a reservation, retried, holds once", async () => {
    const { org, key } = await stack.org({ limits: [{ metric: "tokens", window: "month", limit: 1000 }] });
    const proxy = await lossyProxy(new URL(stack.baseUrl).host, 1);
    try {
      const client = new QuotaplaneClient({ baseUrl: proxy.url, key, retries: 1 });
      const out = await client.reserve({ org, metric: "tokens", amount: 400 });
      assert.equal(out.allowed, true);
      assert.equal(out.reservation?.replayed, true, "the retry was not answered as a replay");
      assert.equal(proxy.connections, 2);
      // 400 held once leaves 600: a second hold of 400 would leave 200.
      const direct = new QuotaplaneClient({ baseUrl: stack.baseUrl, key });
      assert.equal((await direct.reserve({ org, metric: "tokens", amount: 600 })).allowed, true);
    } finally {
      await proxy.close();
    }
  });
});
