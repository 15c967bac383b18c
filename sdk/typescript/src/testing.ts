/**
 * A test kit (`@quotaplane/client/testing`): Quotaplane without a server, for the tests
 * of an app that uses the client or the middlewares. `FakeQuotaplane` decides in
 * memory (a limit per caller, or a function of yours) and records every call;
 * `noopQuotaplane` allows everything and counts nothing, as unkey's NoopRatelimit.
 * Both are `Quotaplane`s, the interface the middlewares take.
 */
import { newIdempotencyKey, type BatchCheckOutcome, type CallOptions, type CheckOutcome, type CheckRequest, type CheckResult, type Costs, type Quotaplane, type Reservation, type ReserveOutcome, type ReserveRequest } from "./client.js";
import { QuotaplaneAbortError, QuotaplaneError } from "./errors.js";

/** One call a FakeQuotaplane was given. */
export type FakeCall =
  | { operation: "check"; request: CheckRequest }
  | { operation: "reserve"; request: ReserveRequest }
  | { operation: "commit"; id: string; used: number | Costs }
  | { operation: "extend"; id: string; ttlSeconds: number }
  | { operation: "release"; id: string };

/** Options of a FakeQuotaplane. */
export interface FakeOptions {
  /**
   * Units each caller (org, team, user and metric) may spend in the fake's lifetime
   * (default: no limit). Checks count their cost; reservations hold their amount until
   * settled, then count what was committed.
   */
  limit?: number;
  /**
   * Decides instead of the limit: true allows, false denies, a QuotaplaneError is thrown
   * as Quotaplane's refusal (e.g. `new QuotaplaneError(400, {...})` for a user not
   * registered).
   */
  decide?: (request: CheckRequest | ReserveRequest, operation: "check" | "reserve") => boolean | QuotaplaneError;
  /** Seconds a denial says to wait (default 1). */
  retryAfterSeconds?: number;
}

/**
 * A Quotaplane in memory: decisions by `limit` or `decide`, reservations held, committed,
 * extended and released as the API does (409 once settled), every call in `calls`.
 */
export class FakeQuotaplane implements Quotaplane {
  /** Every call, in order. */
  readonly calls: FakeCall[] = [];
  /** Reservations by id. */
  readonly reservations = new Map<string, Reservation>();
  readonly #opts: FakeOptions;
  readonly #used = new Map<string, number>();
  #next = 0;

  constructor(opts: FakeOptions = {}) {
    this.#opts = opts;
  }

  /** What the caller of `request` has used (held reservations included). */
  used(request: { org: string; team?: string; user?: string; metric?: string }): number {
    return this.#used.get(callerKey(request)) ?? 0;
  }

  async check(req: CheckRequest, opts: CallOptions = {}): Promise<CheckOutcome> {
    aborted(opts);
    this.calls.push({ operation: "check", request: req });
    const cost = req.cost ?? 1;
    const allowed = this.#decide(req, "check", cost);
    if (allowed) this.#add(req, cost);
    return { ...this.#outcome(allowed), result: this.#result(req, allowed), idempotencyKey: req.idempotency_key ?? newIdempotencyKey() };
  }

  async checkBatch(reqs: CheckRequest[], opts: CallOptions = {}): Promise<BatchCheckOutcome[]> {
    const out: BatchCheckOutcome[] = [];
    for (const r of reqs) {
      try {
        out.push(await this.check(r, opts));
      } catch (err) {
        if (!(err instanceof QuotaplaneError)) throw err;
        out.push({ idempotencyKey: r.idempotency_key ?? newIdempotencyKey(), error: err });
      }
    }
    return out;
  }

  async reserve(req: ReserveRequest, opts: CallOptions = {}): Promise<ReserveOutcome> {
    aborted(opts);
    this.calls.push({ operation: "reserve", request: req });
    const amount = req.amount ?? 1;
    const allowed = this.#decide(req, "reserve", amount);
    const idempotencyKey = req.idempotency_key ?? newIdempotencyKey();
    if (!allowed) return { ...this.#outcome(false), denied: this.#result(req, false), idempotencyKey };
    this.#add(req, amount);
    const r: Reservation = {
      id: `fake-${++this.#next}`,
      state: "held",
      org: req.org,
      metric: req.metric ?? "requests",
      amount,
      expires_at: new Date(Date.now() + (req.ttl_seconds ?? 60) * 1000).toISOString(),
      on_expiry: req.on_expiry ?? "commit",
    };
    if (req.team !== undefined) r.team = req.team;
    if (req.user !== undefined) r.user = req.user;
    this.reservations.set(r.id, r);
    return { ...this.#outcome(true), reservation: { ...r }, idempotencyKey };
  }

  async commit(id: string, used: number | Costs, opts: CallOptions = {}): Promise<Reservation> {
    aborted(opts);
    this.calls.push({ operation: "commit", id, used });
    const r = this.#held(id);
    const n = typeof used === "number" ? used : Object.values(used).reduce((a, b) => a + b, 0);
    this.#add(r, n - r.amount);
    Object.assign(r, { state: "committed", used: n, released: Math.max(0, r.amount - n), settled_at: new Date().toISOString() });
    if (n > r.amount) r.over_reserved = n - r.amount;
    return { ...r };
  }

  async extend(id: string, ttlSeconds: number, opts: CallOptions = {}): Promise<Reservation> {
    aborted(opts);
    this.calls.push({ operation: "extend", id, ttlSeconds });
    const r = this.#held(id);
    r.expires_at = new Date(Date.now() + ttlSeconds * 1000).toISOString();
    return { ...r };
  }

  async release(id: string, opts: CallOptions = {}): Promise<Reservation> {
    aborted(opts);
    this.calls.push({ operation: "release", id });
    const r = this.#held(id);
    this.#add(r, -r.amount);
    Object.assign(r, { state: "released", used: 0, released: r.amount, settled_at: new Date().toISOString() });
    return { ...r };
  }

  async getReservation(id: string, opts: CallOptions = {}): Promise<Reservation> {
    aborted(opts);
    const r = this.reservations.get(id);
    if (!r) throw new QuotaplaneError(404, { type: "about:blank", title: "Not Found", status: 404, detail: `no reservation ${id}` });
    return { ...r };
  }

  #held(id: string): Reservation {
    const r = this.reservations.get(id);
    if (!r) throw new QuotaplaneError(404, { type: "about:blank", title: "Not Found", status: 404, detail: `no reservation ${id}` });
    if (r.state !== "held") throw new QuotaplaneError(409, { type: "about:blank", title: "Conflict", status: 409, detail: `reservation ${id} is ${r.state}` });
    return r;
  }

  #decide(req: CheckRequest | ReserveRequest, operation: "check" | "reserve", units: number): boolean {
    if (this.#opts.decide) {
      const d = this.#opts.decide(req, operation);
      if (d instanceof QuotaplaneError) throw d;
      return d;
    }
    return this.#opts.limit === undefined || this.used(req) + units <= this.#opts.limit;
  }

  #add(req: { org: string; team?: string; user?: string; metric?: string }, n: number): void {
    const k = callerKey(req);
    this.#used.set(k, (this.#used.get(k) ?? 0) + n);
  }

  #outcome(allowed: boolean): Pick<CheckOutcome, "allowed" | "decidedBy" | "retryAfterSeconds"> {
    return allowed ? { allowed, decidedBy: "quotaplane" } : { allowed, decidedBy: "quotaplane", retryAfterSeconds: this.#opts.retryAfterSeconds ?? 1 };
  }

  #result(req: CheckRequest | ReserveRequest, allowed: boolean): CheckResult {
    const r: CheckResult = { allowed, mode: "enforce", levels: [] };
    if (!allowed) {
      r.retry_after_seconds = this.#opts.retryAfterSeconds ?? 1;
      r.blocked_at = req.user ? { level: "user", id: req.user, window: "month" } : { level: "org", id: req.org, window: "month" };
    }
    return r;
  }
}

/** A Quotaplane that allows every check and reservation and counts nothing (a FakeQuotaplane without a limit). */
export function noopQuotaplane(): Quotaplane {
  return new FakeQuotaplane();
}

function callerKey(r: { org: string; team?: string; user?: string; metric?: string }): string {
  return [r.org, r.team ?? "", r.user ?? "", r.metric ?? "requests"].join("\u0000");
}

function aborted(opts: CallOptions): void {
  if (opts.signal?.aborted) throw new QuotaplaneAbortError(opts.signal.reason);
}
