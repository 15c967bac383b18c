// The SDK's parser of the draft-11 RateLimit-Policy and RateLimit fields agrees with
// the structured-headers package (RFC 9651) on valid fields, and refuses what it
// refuses; and rateLimitHeaders reads either generation.
import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { parseList, type Item } from "structured-headers";

import { formatPolicies, formatServiceLimit, parsePolicies, parseServiceLimits, rateLimitHeaders, type Policy, type ServiceLimit } from "../src/index.js";

// bare reads a structured-headers bare item as the SDK's parser types it.
function bare(v: unknown): { kind: string; value: unknown } {
  if (typeof v === "number") return { kind: Number.isInteger(v) ? "integer" : "decimal", value: v };
  if (typeof v === "string") return { kind: "string", value: v };
  if (typeof v === "boolean") return { kind: "boolean", value: v };
  if (v instanceof ArrayBuffer) return { kind: "binary", value: new Uint8Array(v) };
  if (v instanceof Date) return { kind: "date", value: v.getTime() / 1000 };
  return { kind: "token", value: String(v) }; // a Token
}

// The draft's rules applied to the library's parse: what the SDK must answer.
function libraryPolicies(field: string): Policy[] | undefined {
  let list;
  try {
    list = parseList(field);
  } catch {
    return undefined;
  }
  const out: Policy[] = [];
  for (const m of list) {
    if (Array.isArray(m[0])) return undefined; // an inner list
    const [value, params] = m as Item;
    const name = bare(value);
    if (name.kind !== "string" && name.kind !== "token") return undefined;
    const q = params.has("q") ? bare(params.get("q")) : undefined;
    if (!q || q.kind !== "integer" || (q.value as number) < 0) return undefined;
    const p: Policy = { name: name.value as string, quota: q.value as number };
    if (params.has("w")) {
      const w = bare(params.get("w"));
      if (w.kind !== "integer" || (w.value as number) < 1) return undefined;
      p.window = w.value as number;
    }
    if (params.has("qu")) {
      const qu = bare(params.get("qu"));
      if (qu.kind !== "string") return undefined;
      p.unit = qu.value as string;
    }
    if (params.has("pk")) {
      const pk = bare(params.get("pk"));
      if (pk.kind !== "binary") return undefined;
      p.partitionKey = pk.value as Uint8Array;
    }
    out.push(p);
  }
  return out;
}

function libraryLimits(field: string): ServiceLimit[] | undefined {
  let list;
  try {
    list = parseList(field);
  } catch {
    return undefined;
  }
  const out: ServiceLimit[] = [];
  for (const m of list) {
    if (Array.isArray(m[0])) return undefined;
    const [value, params] = m as Item;
    const name = bare(value);
    if (name.kind !== "string" && name.kind !== "token") return undefined;
    const r = params.has("r") ? bare(params.get("r")) : undefined;
    if (!r || r.kind !== "integer" || (r.value as number) < 0) return undefined;
    const l: ServiceLimit = { name: name.value as string, remaining: r.value as number };
    if (params.has("t")) {
      const t = bare(params.get("t"));
      if (t.kind !== "integer" || (t.value as number) < 0) return undefined;
      l.reset = t.value as number;
    }
    if (params.has("pk")) {
      const pk = bare(params.get("pk"));
      if (pk.kind !== "binary") return undefined;
      l.partitionKey = pk.value as Uint8Array;
    }
    out.push(l);
  }
  return out;
}

const policyFields = [
  `"org-month";q=1000, "team-minute";q=100;w=60, "user-minute";q=20;w=60`,
  `"tokens-user-minute";q=100000;w=60;qu="tokens", "user-concurrent";q=5;qu="concurrent-requests"`,
  `"burst";q=100;w=60,"daily";q=1000;w=86400`,
  `burst;q=100;w=60`,
  `"peruser";q=100;w=60;pk=:cHsdsRa8:`,
  `  "a";q=1  ,  "b";q=2;w=3  `,
  `"a";q=1;q=2`,
  `"a";q=1;x;acme-burst=?1;y=1.5;z=tok/en:x`,
  `"esc\\"aped\\\\";q=0`,
  ``,
  `"a";q=-1`,
  `"a";w=60`,
  `"a";q=1.5`,
  `"a";q="1"`,
  `"a";q=1;w=0`,
  `"a";q=1;qu=tokens`,
  `"a";q=1;pk="x"`,
  `"a";q=1,`,
  `"a";q=1,,"b";q=2`,
  `"a";Q=1`,
  `"a";q=1234567890123456`,
  `1;q=1`,
  `("a" "b");q=1`,
  `"unterminated;q=1`,
  `"a";q=1 "b";q=2`,
  `"a";q=1;pk=:not base64!:`,
];

const limitFields = [
  `"user-minute";r=0;t=42`,
  `"default";r=50;t=30`,
  `"default";r=999;pk=:dHJpYWwxMjEzMjM=:`,
  `"a";r=1, "b";r=2;t=3`,
  `"a";t=3`,
  `"a";r=-1;t=3`,
  `"a";r=1;t=-1`,
  `"a";r=1;t=1.5`,
  `"a";r=1;;t=2`,
  `?1;r=1`,
];

describe("RateLimit fields", () => {
  it("parses RateLimit-Policy as structured-headers does", () => {
    for (const f of policyFields) {
      assert.deepEqual(parsePolicies(f), libraryPolicies(f), f);
    }
    assert.equal(parsePolicies(null), undefined);
  });

  it("parses RateLimit as structured-headers does", () => {
    for (const f of limitFields) {
      assert.deepEqual(parseServiceLimits(f), libraryLimits(f), f);
    }
  });

  it("reads the legacy fields first, else the draft's", () => {
    const both = new Headers({
      "RateLimit-Limit": "20",
      "RateLimit-Remaining": "0",
      "RateLimit-Reset": "42",
      "RateLimit-Policy": `"org-month";q=1000, "user-minute";q=20;w=60`,
      RateLimit: `"user-minute";r=0;t=42`,
    });
    assert.deepEqual(rateLimitHeaders(both), { limit: 20, remaining: 0, reset: 42, policy: "user-minute" });
    const draft = new Headers({ "RateLimit-Policy": `"org-month";q=1000, "user-minute";q=20;w=60`, RateLimit: `"user-minute";r=3;t=7` });
    assert.deepEqual(rateLimitHeaders(draft), { limit: 20, remaining: 3, reset: 7, policy: "user-minute" });
    const legacy = new Headers({ "RateLimit-Limit": "20", "RateLimit-Remaining": "1", "RateLimit-Reset": "5" });
    assert.deepEqual(rateLimitHeaders(legacy), { limit: 20, remaining: 1, reset: 5 });
    assert.equal(rateLimitHeaders(new Headers({ RateLimit: `"a";r=x` })), undefined, "a malformed field is ignored");
  });
});

describe("formatting RateLimit fields (the middleware passes them on)", () => {
  it("writes what the SDK's parser and structured-headers read back", () => {
    const policies: Policy[] = [
      { name: "org-minute", quota: 20, window: 60 },
      { name: "tokens-user-month", quota: 5000000, unit: "tokens" },
      { name: "user-concurrent", quota: 4, unit: "concurrent-requests" },
    ];
    const field = formatPolicies(policies);
    assert.deepEqual(parsePolicies(field), policies);
    assert.equal(parseList(field).length, 3);
    const limit = formatServiceLimit("org-minute", 7, 42);
    assert.deepEqual(parseServiceLimits(limit), [{ name: "org-minute", remaining: 7, reset: 42 }]);
    assert.deepEqual(parseServiceLimits(formatServiceLimit("user-concurrent", 1)), [{ name: "user-concurrent", remaining: 1 }]);
  });
});
