/**
 * The RateLimit-Policy and RateLimit fields of draft-ietf-httpapi-ratelimit-headers-11,
 * which Quotaplane sends beside the legacy RateLimit-Limit, -Remaining and -Reset:
 *
 *   RateLimit-Policy: "org-month";q=1000, "user-minute";q=20;w=60
 *   RateLimit: "user-minute";r=0;t=42
 *
 * A small parser of RFC 9651 structured-field Lists of Items with Parameters, so that
 * the SDK has no runtime dependency; test/ratelimit.test.ts compares it with the
 * structured-headers package on valid and malformed fields. Inner lists and display
 * strings, which these fields never hold, are refused as malformed; a malformed field
 * is ignored (undefined), as the draft says.
 */

/** One item of RateLimit-Policy: a quota policy. */
export interface Policy {
  /** Quotaplane's: "<level>-<window>", or "<metric>-<level>-<window>" for a metric other than requests. */
  name: string;
  /** q: the limit, in `unit`. */
  quota: number;
  /** w: the window in seconds; absent for a month or a concurrent limit. */
  window?: number;
  /** qu: absent for requests, "concurrent-requests", or the metric's name. */
  unit?: string;
  /** pk: the partition key (Quotaplane sends none). */
  partitionKey?: Uint8Array;
}

/** One item of RateLimit: what is left under a policy. */
export interface ServiceLimit {
  name: string;
  /** r: units left. */
  remaining: number;
  /** t: seconds within which no more than `remaining` may be used. */
  reset?: number;
  partitionKey?: Uint8Array;
}

type Bare =
  | { kind: "integer" | "decimal" | "date"; value: number }
  | { kind: "string" | "token"; value: string }
  | { kind: "binary"; value: Uint8Array }
  | { kind: "boolean"; value: boolean };

interface Item {
  value: Bare;
  params: Map<string, Bare>;
}

class Malformed extends Error {}

const isDigit = (c: string) => c >= "0" && c <= "9";
const isLC = (c: string) => c >= "a" && c <= "z";
const isAlpha = (c: string) => isLC(c) || (c >= "A" && c <= "Z");
const isTChar = (c: string) => isAlpha(c) || isDigit(c) || "!#$%&'*+-.^_`|~".includes(c);

/** Parses a structured-field List (RFC 9651 section 4.2) of Items; throws Malformed. */
function parseList(input: string): Item[] {
  const s = input;
  let i = 0;
  while (s.charAt(i) === " ") i++;
  const out: Item[] = [];
  const ows = () => {
    while (s.charAt(i) === " " || s.charAt(i) === "\t") i++;
  };
  const key = (): string => {
    const start = i;
    if (!(isLC(s.charAt(i)) || s.charAt(i) === "*")) throw new Malformed("key");
    while (i < s.length && (isLC(s.charAt(i)) || isDigit(s.charAt(i)) || "_-.*".includes(s.charAt(i)))) i++;
    return s.slice(start, i);
  };
  const number = (): Bare => {
    const start = i;
    if (s.charAt(i) === "-") i++;
    const d0 = i;
    while (isDigit(s.charAt(i))) i++;
    const intDigits = i - d0;
    if (intDigits === 0) throw new Malformed("number");
    if (s.charAt(i) === ".") {
      if (intDigits > 12) throw new Malformed("decimal");
      i++;
      const f0 = i;
      while (isDigit(s.charAt(i))) i++;
      if (i - f0 < 1 || i - f0 > 3) throw new Malformed("decimal");
      return { kind: "decimal", value: Number(s.slice(start, i)) };
    }
    if (intDigits > 15) throw new Malformed("integer");
    return { kind: "integer", value: Number(s.slice(start, i)) };
  };
  const bare = (): Bare => {
    const c = s.charAt(i);
    if (c === "") throw new Malformed("item");
    if (c === "-" || isDigit(c)) return number();
    if (c === '"') {
      i++;
      let v = "";
      while (i < s.length) {
        const ch = s.charAt(i++);
        if (ch === "\\") {
          const n = s.charAt(i++);
          if (n !== '"' && n !== "\\") throw new Malformed("escape");
          v += n;
        } else if (ch === '"') {
          return { kind: "string", value: v };
        } else {
          const code = ch.charCodeAt(0);
          if (code < 0x20 || code > 0x7e) throw new Malformed("string");
          v += ch;
        }
      }
      throw new Malformed("string");
    }
    if (c === "*" || isAlpha(c)) {
      const start = i++;
      while (i < s.length && (isTChar(s.charAt(i)) || s.charAt(i) === ":" || s.charAt(i) === "/")) i++;
      return { kind: "token", value: s.slice(start, i) };
    }
    if (c === ":") {
      const end = s.indexOf(":", i + 1);
      if (end < 0) throw new Malformed("binary");
      const enc = s.slice(i + 1, end);
      if (!/^[A-Za-z0-9+/=]*$/.test(enc) || enc.length % 4 !== 0 || /=[^=]/.test(enc)) throw new Malformed("binary");
      i = end + 1;
      return { kind: "binary", value: Uint8Array.from(atob(enc), (ch) => ch.charCodeAt(0)) };
    }
    if (c === "?") {
      const b = s.charAt(i + 1);
      if (b !== "0" && b !== "1") throw new Malformed("boolean");
      i += 2;
      return { kind: "boolean", value: b === "1" };
    }
    if (c === "@") {
      i++;
      const n = number();
      if (n.kind !== "integer") throw new Malformed("date");
      return { kind: "date", value: n.value };
    }
    throw new Malformed(`unexpected ${c}`);
  };
  while (i < s.length) {
    if (s.charAt(i) === "(") throw new Malformed("inner list");
    const value = bare();
    const params = new Map<string, Bare>();
    while (s.charAt(i) === ";") {
      i++;
      while (s.charAt(i) === " ") i++;
      const k = key();
      let v: Bare = { kind: "boolean", value: true };
      if (s.charAt(i) === "=") {
        i++;
        v = bare();
      }
      params.set(k, v); // a repeated key keeps its place and takes the last value
    }
    out.push({ value, params });
    ows();
    if (i >= s.length) return out;
    if (s.charAt(i) !== ",") throw new Malformed("want ,");
    i++;
    ows();
    if (i >= s.length) throw new Malformed("trailing ,");
  }
  return out;
}

function nameOf(it: Item): string {
  if (it.value.kind !== "string" && it.value.kind !== "token") throw new Malformed("name");
  return it.value.value;
}

function intParam(it: Item, key: string, min: number, required: boolean): number | undefined {
  const v = it.params.get(key);
  if (v === undefined) {
    if (required) throw new Malformed(`no ${key}`);
    return undefined;
  }
  if (v.kind !== "integer" || v.value < min) throw new Malformed(key);
  return v.value;
}

function pkParam(it: Item): Uint8Array | undefined {
  const v = it.params.get("pk");
  if (v === undefined) return undefined;
  if (v.kind !== "binary") throw new Malformed("pk");
  return v.value;
}

/**
 * Parses a RateLimit-Policy field value (several field lines joined with ", ", as
 * fetch's Headers.get joins them); undefined when malformed.
 */
export function parsePolicies(field: string | null | undefined): Policy[] | undefined {
  if (field == null) return undefined;
  try {
    return parseList(field).map((it) => {
      const p: Policy = { name: nameOf(it), quota: intParam(it, "q", 0, true)! };
      const w = intParam(it, "w", 1, false);
      if (w !== undefined) p.window = w;
      const qu = it.params.get("qu");
      if (qu !== undefined) {
        if (qu.kind !== "string") throw new Malformed("qu");
        p.unit = qu.value;
      }
      const pk = pkParam(it);
      if (pk !== undefined) p.partitionKey = pk;
      return p;
    });
  } catch (err) {
    if (err instanceof Malformed) return undefined;
    throw err;
  }
}

/** Parses a RateLimit field value; undefined when malformed. */
export function parseServiceLimits(field: string | null | undefined): ServiceLimit[] | undefined {
  if (field == null) return undefined;
  try {
    return parseList(field).map((it) => {
      const l: ServiceLimit = { name: nameOf(it), remaining: intParam(it, "r", 0, true)! };
      const t = intParam(it, "t", 0, false);
      if (t !== undefined) l.reset = t;
      const pk = pkParam(it);
      if (pk !== undefined) l.partitionKey = pk;
      return l;
    });
  } catch (err) {
    if (err instanceof Malformed) return undefined;
    throw err;
  }
}

/** A policy name as an sf-string: Quotaplane's names are plain ASCII; quotes and backslashes are escaped. */
function sfString(s: string): string {
  return `"${s.replace(/[\\"]/g, (c) => "\\" + c)}"`;
}

/**
 * The RateLimit-Policy field of policies, as Quotaplane sends it (the middleware passes
 * Quotaplane's policies on to its own callers): `"name";q=100;w=60;qu="tokens"`.
 */
export function formatPolicies(policies: Policy[]): string {
  return policies
    .map((p) => sfString(p.name) + `;q=${Math.trunc(p.quota)}` + (p.window !== undefined ? `;w=${Math.trunc(p.window)}` : "") + (p.unit !== undefined ? `;qu=${sfString(p.unit)}` : ""))
    .join(", ");
}

/** The RateLimit field of one policy's remaining units: `"name";r=50;t=30` (t left out when unknown). */
export function formatServiceLimit(name: string, remaining: number, reset?: number): string {
  return sfString(name) + `;r=${Math.max(0, Math.trunc(remaining))}` + (reset !== undefined ? `;t=${Math.max(0, Math.trunc(reset))}` : "");
}
