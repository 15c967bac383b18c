// entitlements, feature and entitled against a real quotaplane-api (API.md "Money:
// rates, budgets, entitlements"): the plan's features with the org's overrides.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { QuotaplaneClient, QuotaplaneError, grants } from "../src/index.js";
import { Stack } from "./harness.js";

let stack: Stack;
before(async () => {
  stack = await Stack.start();
});
after(async () => {
  await stack?.stop();
});

describe("entitlements", () => {
  it("resolves the plan's features with the org's overrides", async () => {
    const { org, key } = await stack.org({ limits: [{ metric: "requests", window: "minute", limit: 10 }] });
    const { plan } = await stack.api_("GET", `/v1/orgs/${org}`);
    await stack.api_("PATCH", `/v1/plans/${plan}`, { features: { sso: true, seats: 25, tier: "gold", beta: true, audit: false } });
    await stack.api_("PUT", `/v1/orgs/${org}/features`, { features: { seats: 50, beta: null, trial: 0 } });
    await stack.api_("POST", `/v1/orgs/${org}/teams`, { id: "eng", name: "Eng" });
    const client = new QuotaplaneClient({ baseUrl: stack.baseUrl, key });

    const e = await client.entitlements(org, "eng", "alice");
    assert.deepEqual(e, {
      org, team: "eng", user: "alice",
      features: { sso: true, seats: 50, tier: "gold", audit: false, trial: 0 },
      sources: { sso: "plan", seats: "org", tier: "plan", audit: "plan", trial: "org" },
    });
    assert.equal(await client.feature(org, undefined, undefined, "seats"), 50);
    assert.equal(await client.feature(org, undefined, undefined, "beta"), undefined, "removed by the override");
    const entitled = Object.fromEntries(await Promise.all(["sso", "seats", "tier", "audit", "trial", "beta", "nope"].map(
      async (f) => [f, await client.entitled(org, "eng", undefined, f)])));
    assert.deepEqual(entitled, { sso: true, seats: true, tier: true, audit: false, trial: false, beta: false, nope: false });

    await assert.rejects(client.entitled(org, "nope", undefined, "sso"), (err: unknown) => err instanceof QuotaplaneError && err.status === 404);
    await assert.rejects(client.feature("another-org", undefined, undefined, "sso"), (err: unknown) => err instanceof QuotaplaneError && err.status === 404);
  });

  it("grants: present and not false, 0 or the empty string", () => {
    assert.deepEqual([true, 1, -1, "gold", false, 0, "", undefined].map(grants), [true, true, true, true, false, false, false, false]);
  });
});
