// verifyWebhook against what Go's package webhook signs and accepts, and against a
// delivery signed by a real quotaplane-worker.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { createServer, type IncomingHttpHeaders } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, it } from "node:test";

import { DELIVERY_HEADER, EVENT_HEADER, QuotaplaneClient, SIGNATURE_HEADER, signWebhook, verifyWebhook, WebhookVerificationError } from "../src/index.js";
import { repoRoot, Stack } from "./harness.js";

interface GoCase {
  secret: string;
  body: Uint8Array;
  sign_at: number;
  header: string;
  now_ms: number;
}

/** What Go's webhook.Sign and webhook.Verify answer for each case (test/testdata/gosign). */
function goAnswers(cases: GoCase[]): { signed: string; verify: string }[] {
  const input = cases.map((c) => JSON.stringify({ ...c, body: Buffer.from(c.body).toString("base64") })).join("\n") + "\n";
  const out = execFileSync("go", ["run", "./sdk/typescript/test/testdata/gosign"], { cwd: repoRoot, input, encoding: "utf8" });
  return out.trim().split("\n").map((l) => JSON.parse(l));
}

function tsVerify(c: GoCase): string {
  try {
    verifyWebhook(c.secret, c.header, c.body, { now: new Date(c.now_ms) });
    return "ok";
  } catch (e) {
    if (e instanceof WebhookVerificationError) return e.reason;
    throw e;
  }
}

describe("verifyWebhook and signWebhook", () => {
  it("agree with Go's webhook.Sign and webhook.Verify, case by case", () => {
    const now = Date.now();
    const t = Math.floor(now / 1000);
    const cases: GoCase[] = [];
    const add = (secret: string, body: Uint8Array, header: (h: string, sig: string) => string, nowMs = now, signAt = t) => {
      const h = signWebhook(secret, body, new Date(signAt * 1000));
      cases.push({ secret, body, sign_at: signAt, header: header(h, h.slice(h.indexOf("v1=") + 3)), now_ms: nowMs });
    };
    const json = Buffer.from(`{"id":17,"type":"usage.threshold","org":"demo","data":{"note":"é ✓"}}`);
    const binary = randomBytes(512); // any bytes, not only UTF-8
    for (const [secret, body] of [
      ["3af2fb1d0c5e4a8f9b7d6c5e4a3b2c1d", json],
      ["sécret ✓", binary],
      ["k", new Uint8Array()],
    ] as const) {
      add(secret, body, (h) => h); // as sent
      add(secret, body, (h) => h, now + 299_000); // just within the tolerance
      add(secret, body, (h) => h, now + 301_000); // a replay, later
      add(secret, body, (h) => h, now - 301_000); // from the future
      add(secret, body, (_h, sig) => `v1=${sig},t=${t}`); // the other order
      add(secret, body, (h) => `${h},v0=deadbeef`); // another scheme beside it
      add(secret, body, (_h, sig) => `t=${t},v1=${sig.toUpperCase()}`);
      add(secret, body, (_h, sig) => `t=+${t},v1=${sig}`);
      add(secret, body, (_h, sig) => `t=0${t},v1=${sig}`);
      add(secret, body, (_h, sig) => `t=${t - 1},v1=${sig}`);
      add(secret, body, (_h, sig) => `t=${t},v1=${sig.slice(0, -1)}`);
      add(secret, body, (_h, sig) => `t=${t},t=${t + 1},v1=${sig}`);
      // Two signatures, as during a secret rotation: this secret's first or second.
      add(secret, body, (_h, sig) => `t=${t},v1=${sig},v1=${"0".repeat(64)}`);
      add(secret, body, (_h, sig) => `t=${t},v1=${"0".repeat(64)},v1=${sig}`);
      add(secret, body, (_h, sig) => `t=${t},v1=${sig},v1=`);
      add(secret, body, () => `t=${t},v1=${"0".repeat(64)},v1=${"1".repeat(64)}`);
      add(secret + "x", body, (h) => h.replace(/v1=.*/, "v1=" + signWebhook(secret, body, new Date(t * 1000)).split("v1=")[1]));
    }
    for (const header of ["", "t=", "v1=abc", `t=${t}`, `t=${t},v1=`, `t=abc,v1=ab`, `t=99999999999999999999,v1=ab`, `t=-5,v1=ab`, "garbage", `t =${t},v1=ab`]) {
      cases.push({ secret: "s", body: json, sign_at: t, header, now_ms: now });
    }
    const tampered = Buffer.from(json);
    tampered[10] = tampered[10]! ^ 1;
    cases.push({ secret: "s", body: tampered, sign_at: t, header: signWebhook("s", json, new Date(t * 1000)), now_ms: now });

    const goSays = goAnswers(cases);
    assert.equal(goSays.length, cases.length);
    const kinds = new Set<string>();
    cases.forEach((c, i) => {
      const go = goSays[i]!;
      assert.equal(signWebhook(c.secret, c.body, new Date(c.sign_at * 1000)), go.signed, `case ${i}: Sign`);
      assert.equal(tsVerify(c), go.verify, `case ${i}: header ${JSON.stringify(c.header)}`);
      kinds.add(go.verify);
    });
    assert.deepEqual([...kinds].sort(), ["malformed", "mismatch", "ok", "timestamp"], "the cases cover every answer");
  });
});

describe("a delivery from a real quotaplane-worker", () => {
  let stack: Stack;
  before(async () => {
    stack = await Stack.start({ worker: true });
  });
  after(async () => {
    await stack?.stop();
  });

  it("verifies with the org's signing secret, and not once changed", async () => {
    const deliveries: { headers: IncomingHttpHeaders; body: Buffer }[] = [];
    let delivered: () => void = () => {};
    const got = new Promise<void>((resolve) => (delivered = resolve));
    const receiver = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        deliveries.push({ headers: req.headers, body: Buffer.concat(chunks) });
        res.statusCode = 204;
        res.end();
        delivered();
      });
    });
    await new Promise<void>((resolve) => receiver.listen(0, "127.0.0.1", resolve));
    try {
      const { org, key } = await stack.org({ limits: [{ metric: "requests", window: "month", limit: 10 }] });
      const url = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}/hooks/quotaplane`;
      await stack.api_("PATCH", `/v1/orgs/${org}`, { webhook_url: url }, key);
      const info = await stack.api_("GET", `/v1/orgs/${org}/webhook`, undefined, key);
      assert.equal(info.signature_header, SIGNATURE_HEADER);
      const secret = info.signing_secret as string;
      assert.ok(secret, JSON.stringify(info));

      // 9 of 10 a month: past 80 %, so the worker sends usage.threshold when it next persists usage.
      const client = new QuotaplaneClient({ baseUrl: stack.baseUrl, key });
      assert.equal((await client.check({ org, cost: 9 })).allowed, true);
      await Promise.race([
        got,
        new Promise((_, reject) => setTimeout(() => reject(new Error(`no delivery in 30 s:\n${stack.worker?.log()}`)), 30_000)),
      ]);

      const d = deliveries[0]!;
      const header = d.headers[SIGNATURE_HEADER.toLowerCase()] as string;
      assert.match(header, /^t=\d+,v1=[0-9a-f]{64}$/);
      assert.equal(d.headers[EVENT_HEADER.toLowerCase()], "usage.threshold");
      assert.match(String(d.headers[DELIVERY_HEADER.toLowerCase()]), /^\d+$/);
      verifyWebhook(secret, header, d.body);
      verifyWebhook(secret, header, d.body.toString("utf8")); // the same bytes, as a string
      const event = JSON.parse(d.body.toString("utf8"));
      assert.deepEqual([event.type, event.org], ["usage.threshold", org]);

      const reason = (fn: () => void) => {
        try {
          fn();
          return "ok";
        } catch (e) {
          return e instanceof WebhookVerificationError ? e.reason : String(e);
        }
      };
      const changed = Buffer.from(d.body.toString("utf8").replace(org, "evil"));
      assert.equal(reason(() => verifyWebhook(secret, header, changed)), "mismatch");
      assert.equal(reason(() => verifyWebhook(secret + "x", header, d.body)), "mismatch");
      assert.equal(reason(() => verifyWebhook(secret, header, d.body, { now: new Date(Date.now() + 10 * 60_000) })), "timestamp");
      assert.equal(reason(() => verifyWebhook(secret, undefined, d.body)), "malformed");
    } finally {
      await new Promise<void>((resolve) => receiver.close(() => resolve()));
    }
  });
});
