// Client leases (API.md "Client leases", DESIGN.md "Client leases"): a hot path (org,
// team, user, metric) is decided in this process from units the server took atomically
// from every level, and every lease is settled with exactly what it admitted.
//
// What holds, and why:
// - Admission is a comparison and two assignments on the lease, with no await between
//   them: JavaScript runs one callback at a time per process, so no two checks can
//   take the same unit, and closing a lease (open = false) is atomic with respect to
//   admissions: after it, `used` is final and is what the settle sends.
// - A lease admits only before its local deadline: performance.now() when the request
//   that took it was first sent, plus ttl_ms. The server starts the lease's life when
//   it receives that request, later than it was sent, so the local deadline never
//   passes the server's.
// - At most one unsettled lease per path: a path asks again only once its current
//   lease was closed and the request settling it came back (a renewal rides on that
//   request); while a request is in flight its checks wait for it a few ms, then go to
//   the server one by one.
// - A lease closes at 75 % of its life or of its units (a timer, unref'd, so that it
//   does not keep a process alive), or when a check finds it past its deadline, and is
//   settled at once; a settle that fails is retried until settle_by, then given up
//   (the server counts the lease whole). A renewing settle is sent once, and retried
//   without renew (a repeat takes no next lease, and a lost answer's is counted whole).
import { rateLimitOf, type CallOptions, type CheckOutcome, type CheckRequest, type CheckResult, type LevelStatus, type RateLimit } from "./client.js";
import { QuotaplaneAbortError, QuotaplaneUnavailableError } from "./errors.js";

/** A lease as POST /v1/leases (or a renewal) grants it. */
export interface LeaseGrant {
  id: string;
  units: number;
  expires_at: string;
  ttl_ms: number;
  settle_by: string;
  levels: LevelStatus[];
}

/** "Check this path one by one now; ask again in ttl_ms." */
export interface LeaseRefusal {
  units: 0;
  reason: "client_leases_off" | "near_limit" | "not_leasable" | (string & {});
  ttl_ms: number;
}

/** The answer of POST /v1/leases: a lease, or units 0. */
export type LeaseAnswer = LeaseGrant | LeaseRefusal;

/** The answer of POST /v1/leases/{id}/settle. */
export interface SettleAnswer {
  settled: { used: number; released: number };
  next: LeaseAnswer | null;
}

/** What onLease is told: a lease taken, refused, closed, settled, or a request about one that failed. */
export interface LeaseEvent {
  /**
   * `taken`: a lease of `units` (a first one or a renewal); `refused`: units 0 for
   * `reason`, the path checks one by one for `ttlMs`; `closed`: the lease admits no
   * more, `used` is final and its settle is sent; `settled`: the server counted `used`
   * and gave back `released`; `failed`: taking (no `id`) or settling a lease failed
   * (`error`); the path checks one by one a while.
   */
  event: "taken" | "refused" | "closed" | "settled" | "failed";
  org: string;
  team?: string;
  user?: string;
  metric: string;
  id?: string;
  units?: number;
  used?: number;
  released?: number;
  ttlMs?: number;
  settleBy?: string;
  reason?: string;
  error?: unknown;
}

/** How the lease machinery reaches the server (the client's #call, with its budget and retries). */
export interface LeaseTransport {
  /** POST path with body; resolves the parsed 200/201 answer, rejects on anything else. */
  post(path: string, body: unknown, budgetMs: number, retries: number): Promise<unknown>;
  /** The client's budget for a check, in ms: what taking a lease may cost at most. */
  budgetMs: number;
  onLease?: ((e: LeaseEvent) => void) | undefined;
  onDecision?: ((out: CheckOutcome) => void) | undefined;
}

// How long a check of a path whose lease request is in flight waits for its answer
// before it goes to the server on its own.
const waitForLeaseMs = 5;
// After a failed lease request or settle, a path checks one by one this long.
const backoffMs = 1000;
// A path unseen this long, with no lease and nothing in flight, is forgotten.
const idleMs = 10_000;
// A lease closes and is renewed at this share of its life or units.
const renewAhead = 0.75;
// A settle is retried until this long before settle_by.
const settleMarginMs = 100;

class Lease {
  readonly id: string;
  readonly units: number;
  used = 0;
  open = true;
  seq = 0;
  readonly deadline: number;
  readonly renewAt: number;
  readonly settleBy: string;
  // settle_by on this process's monotonic clock: as far after the local deadline as
  // the server's settle_by is after its expires_at (no wall clock compared).
  readonly settleByLocal: number;
  readonly levels: LevelStatus[];
  readonly rateLimit: RateLimit | undefined;
  timer: ReturnType<typeof setTimeout> | undefined;

  constructor(g: LeaseGrant, sentAt: number, rateLimit: RateLimit | undefined) {
    this.id = g.id;
    this.units = g.units;
    this.deadline = sentAt + g.ttl_ms;
    this.renewAt = sentAt + g.ttl_ms * renewAhead;
    this.settleBy = g.settle_by;
    const grace = Date.parse(g.settle_by) - Date.parse(g.expires_at);
    this.settleByLocal = this.deadline + (Number.isFinite(grace) ? grace : 0);
    this.levels = g.levels ?? [];
    this.rateLimit = rateLimit;
  }
}

class Path {
  // The rate: units of the current one-second bucket and of the one before.
  bucket = -1;
  cur = 0;
  prev = 0;
  lease: Lease | undefined;
  // A lease request or a settle of this path in flight, and what checks wait on.
  inflight: Promise<void> | undefined;
  wait: Promise<void> | undefined;
  quietUntil = 0;
  seen = 0;

  constructor(
    readonly org: string,
    readonly team: string | undefined,
    readonly user: string | undefined,
    readonly metric: string,
  ) {}

  observe(cost: number, now: number): void {
    const b = Math.floor(now / 1000);
    if (b !== this.bucket) {
      this.prev = b === this.bucket + 1 ? this.cur : 0;
      this.cur = 0;
      this.bucket = b;
    }
    this.cur += cost;
    this.seen = now;
  }

  // rate estimates the units of the last second: this bucket's, and the previous
  // bucket's weighted by the part of it still inside that second.
  rate(now: number): number {
    const b = Math.floor(now / 1000);
    if (b === this.bucket) return this.cur + this.prev * (1 - (now / 1000 - b));
    if (b === this.bucket + 1) return this.cur * (1 - (now / 1000 - b));
    return 0;
  }

  describe(): Pick<LeaseEvent, "org" | "team" | "user" | "metric"> {
    const d: Pick<LeaseEvent, "org" | "team" | "user" | "metric"> = { org: this.org, metric: this.metric };
    if (this.team !== undefined) d.team = this.team;
    if (this.user !== undefined) d.user = this.user;
    return d;
  }
}

/** Whether a check may be decided from a lease: one metric, a cost above 0, no idempotency key of the caller's. */
export function leasable(req: CheckRequest): boolean {
  if (req.costs !== undefined || req.idempotency_key !== undefined) return false;
  const cost = req.cost ?? 1;
  return Number.isInteger(cost) && cost > 0;
}

// Clients with leases that a process leaving its event loop empty settles
// (beforeExit), so that a process that ends normally leaves no lease counted whole.
const holding = new Set<Leases>();
let exitHooked = false;
function hookExit(): void {
  if (exitHooked) return;
  exitHooked = true;
  const proc = (globalThis as { process?: { on?: (ev: string, fn: () => void) => void } }).process;
  proc?.on?.("beforeExit", () => {
    for (const l of holding) l.settleAll();
  });
}

/**
 * The leases of one client: decides checks of hot paths in process, takes, renews and
 * settles leases, and settles them all on close.
 */
export class Leases {
  readonly #t: LeaseTransport;
  readonly #threshold: number;
  readonly #paths = new Map<string, Path>();
  readonly #inflight = new Set<Promise<void>>();
  #closed = false;
  #lastPrune = 0;
  #open = 0; // leases open (admitting)

  constructor(transport: LeaseTransport, threshold: number) {
    this.#t = transport;
    this.#threshold = threshold;
  }

  /**
   * Decides `req` from its path's lease when it can: the outcome, or a promise of it
   * when the path's lease request is in flight (undefined there: check with the
   * server), or undefined (check with the server). req must be leasable.
   */
  admit(req: CheckRequest, opts: CallOptions): CheckOutcome | Promise<CheckOutcome | undefined> | undefined {
    if (this.#closed) return undefined;
    if (opts.signal?.aborted) throw new QuotaplaneAbortError(opts.signal.reason);
    const metric = req.metric ?? "requests";
    const key = `${req.org}\u0000${req.team ?? ""}\u0000${req.user ?? ""}\u0000${metric}`;
    const now = performance.now();
    let p = this.#paths.get(key);
    if (p === undefined) {
      if (now - this.#lastPrune > idleMs) this.#prune(now);
      p = new Path(req.org, req.team, req.user, metric);
      this.#paths.set(key, p);
    }
    const cost = req.cost ?? 1;
    p.observe(cost, now);
    const got = this.#fromLease(p, cost, now);
    if (got !== undefined) return got;
    if (p.lease === undefined && p.inflight === undefined && now >= p.quietUntil && p.rate(now) > this.#threshold) this.#take(p);
    const wait = p.wait;
    if (wait === undefined) return undefined;
    return wait.then(() => (this.#closed ? undefined : this.#fromLease(p, cost, performance.now())));
  }

  #fromLease(p: Path, cost: number, now: number): CheckOutcome | undefined {
    const l = p.lease;
    if (l === undefined) return undefined;
    if (now >= l.deadline) {
      this.#close(p, l);
      return undefined;
    }
    if (l.units - l.used < cost) return undefined;
    l.used += cost;
    const out: CheckOutcome = {
      allowed: true,
      decidedBy: "quotaplane",
      leased: true,
      result: { allowed: true, mode: "enforce", levels: l.levels } as CheckResult,
      rateLimit: l.rateLimit,
      idempotencyKey: `${l.id}:${++l.seq}`,
    };
    if (l.used >= l.units * renewAhead) this.#close(p, l);
    this.#t.onDecision?.(out);
    return out;
  }

  // #take asks for a lease of p.
  #take(p: Path): void {
    const body: Record<string, unknown> = { org: p.org, metric: p.metric, rate: round(p.rate(performance.now())) };
    if (p.team !== undefined) body.team = p.team;
    if (p.user !== undefined) body.user = p.user;
    const sentAt = performance.now();
    // Not retried: taking a lease carries no idempotency key, and a check that finds
    // no lease goes to the server anyway.
    const req = this.#t.post("/v1/leases", body, this.#t.budgetMs, 0).then(
      (ans) => this.#install(p, ans as LeaseAnswer, sentAt),
      (err: unknown) => {
        p.quietUntil = performance.now() + backoffMs;
        this.#event({ event: "failed", ...p.describe(), error: err });
      },
    );
    this.#track(p, req);
  }

  // #track makes req p's request in flight, which checks of p wait on a few ms.
  #track(p: Path, req: Promise<void>): void {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const done = req.finally(() => {
      clearTimeout(timer);
      if (p.inflight === done) {
        p.inflight = undefined;
        p.wait = undefined;
      }
      this.#inflight.delete(done);
      this.#holding();
    });
    p.inflight = done;
    p.wait = Promise.race([
      done,
      new Promise<void>((resolve) => {
        timer = setTimeout(resolve, waitForLeaseMs);
        unref(timer);
      }),
    ]);
    this.#inflight.add(done);
    this.#holding();
  }

  #install(p: Path, ans: LeaseAnswer, sentAt: number): void {
    if (!(ans.units > 0)) {
      const r = ans as LeaseRefusal;
      p.quietUntil = performance.now() + (r.ttl_ms ?? backoffMs);
      this.#event({ event: "refused", ...p.describe(), reason: r.reason, ttlMs: r.ttl_ms });
      return;
    }
    const l = this.#hold(p, ans as LeaseGrant, sentAt);
    const now = performance.now();
    if (this.#closed || now >= l.renewAt) {
      this.#close(p, l);
      return;
    }
    l.timer = setTimeout(() => this.#close(p, l), l.renewAt - now);
    unref(l.timer);
  }

  // #hold makes g the open lease of p.
  #hold(p: Path, g: LeaseGrant, sentAt: number): Lease {
    const l = new Lease(g, sentAt, rateLimitOf({ allowed: true, levels: g.levels ?? [] }));
    p.lease = l;
    this.#open++;
    this.#event({ event: "taken", ...p.describe(), id: l.id, units: l.units, ttlMs: g.ttl_ms, settleBy: l.settleBy });
    return l;
  }

  // #close stops l admitting (its used is final from here) and settles it, renewing
  // when the path is still hot.
  #close(p: Path, l: Lease, mayRenew = true): void {
    if (!l.open) return;
    l.open = false;
    this.#open--;
    clearTimeout(l.timer);
    if (p.lease === l) p.lease = undefined;
    const now = performance.now();
    const renew = mayRenew && !this.#closed && now >= p.quietUntil && p.rate(now) > this.#threshold;
    this.#event({ event: "closed", ...p.describe(), id: l.id, units: l.units, used: l.used });
    const path = `/v1/leases/${encodeURIComponent(l.id)}/settle`;
    const budget = () => l.settleByLocal - performance.now() - settleMarginMs;
    const plain = () =>
      budget() > 0 ? this.#t.post(path, { used: l.used }, budget(), Number.MAX_SAFE_INTEGER) : Promise.reject(new Error("quotaplane: settle_by passed before the lease could be settled"));
    const sentAt = performance.now();
    // A renewing settle is sent once: when its answer is lost the server may have taken
    // the next lease, and a repeat takes none, so the retries settle without renew
    // (the lost next lease is counted whole at its settle_by); a next lease a repeat
    // still brings is settled at once.
    let renewing = renew;
    const first = renew ? this.#t.post(path, { used: l.used, renew: true, rate: round(p.rate(now)) }, Math.max(1, budget()), 0) : plain();
    const settle = first
      .catch((err: unknown) => {
        if (!renew || !(err instanceof QuotaplaneUnavailableError)) throw err;
        renewing = false;
        return plain();
      })
      .then(
        (ans) => {
          const a = ans as SettleAnswer;
          this.#event({ event: "settled", ...p.describe(), id: l.id, used: a.settled?.used, released: a.settled?.released });
          if (!a.next || !(a.next.units > 0)) return;
          if (renewing) this.#install(p, a.next, sentAt);
          else this.#close(p, this.#hold(p, a.next as LeaseGrant, sentAt), false);
        },
        (err: unknown) => {
          if (renew) p.quietUntil = performance.now() + backoffMs;
          this.#event({ event: "failed", ...p.describe(), id: l.id, used: l.used, error: err });
        },
      );
    this.#track(p, settle);
  }

  /** Closes and settles every open lease (renew false), without closing the client. */
  settleAll(): void {
    const closed = this.#closed;
    this.#closed = true;
    for (const p of this.#paths.values()) if (p.lease) this.#close(p, p.lease);
    this.#closed = closed;
  }

  /**
   * Closes: no check is decided from a lease any more; settles every lease (renew
   * false), including those requests in flight still bring, and waits for it, at most
   * `boundMs`.
   */
  async close(boundMs: number): Promise<void> {
    this.#closed = true;
    for (const p of this.#paths.values()) if (p.lease) this.#close(p, p.lease);
    const deadline = performance.now() + boundMs;
    while (this.#inflight.size > 0) {
      const left = deadline - performance.now();
      if (left <= 0) return;
      let timer: ReturnType<typeof setTimeout> | undefined;
      await Promise.race([
        Promise.allSettled([...this.#inflight]),
        new Promise<void>((resolve) => {
          timer = setTimeout(resolve, left);
        }),
      ]);
      clearTimeout(timer);
    }
  }

  #holding(): void {
    if (this.#inflight.size > 0 || this.#open > 0) {
      hookExit();
      holding.add(this);
    } else holding.delete(this);
  }

  #prune(now: number): void {
    this.#lastPrune = now;
    for (const [k, p] of this.#paths) {
      if (p.lease === undefined && p.inflight === undefined && now - p.seen > idleMs && now >= p.quietUntil) this.#paths.delete(k);
    }
  }

  #event(e: LeaseEvent): void {
    const fn = this.#t.onLease;
    if (!fn) return;
    try {
      fn(e);
    } catch {
      // a hook's exception is ignored, as the client's other hooks'
    }
  }
}

function round(n: number): number {
  return Math.round(n * 100) / 100;
}

function unref(t: ReturnType<typeof setTimeout>): void {
  (t as { unref?: () => void }).unref?.();
}
