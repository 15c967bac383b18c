import type { components } from "./schema.js";
import { QuotaplaneAbortError, QuotaplaneConfigError, QuotaplaneError, QuotaplaneUnavailableError, type Problem } from "./errors.js";
import { parsePolicies, parseServiceLimits, type Policy } from "./ratelimit.js";
import { VERSION } from "./version.js";
import { entitlementsPath, grants, type Entitlements, type FeatureValue } from "./entitlements.js";
import { Coalescer, type Waiting } from "./coalesce.js";
import { leasable, Leases, type LeaseEvent } from "./leases.js";

type Schemas = components["schemas"];

/**
 * Units per metric, decided at once, all or nothing (API.md "Several metrics in one
 * decision"): `{ requests: 1, tokens: 1200 }`, 1 to 16 metrics.
 */
export type Costs = Record<string, number>;

/** A window of a limit; `concurrent` bounds what open reservations hold at once (API.md "Concurrency limits"). */
export type Window = Schemas["Window"] | "concurrent";

/** A level and window named by a denial (`blocked_at`) or a shadow check (`would_block`), with its limit's metric. */
export type LevelRef = Omit<Schemas["LevelRef"], "window"> & { window: Window; metric?: string };
/** One level, metric and window of a check's answer. */
export type LevelStatus = Omit<Schemas["LevelStatus"], "window"> & { window: Window; metric?: string };

/** The answer of Quotaplane to a check (200 allowed, 429 denied). */
export type CheckResult = Omit<Schemas["CheckResult"], "levels" | "blocked_at" | "would_block"> & {
  levels: LevelStatus[];
  blocked_at?: LevelRef;
  would_block?: LevelRef;
};

/**
 * A check as POST /v1/check takes it. `metric` defaults to `requests` and `cost` to 1
 * (the generated type marks them required because the spec gives them defaults);
 * `costs` names several metrics instead of them. `idempotency_key` is generated when
 * absent, so that a retry never counts twice.
 */
export type CheckRequest = Omit<Schemas["CheckRequest"], "metric" | "cost" | "costs"> &
  Partial<Pick<Schemas["CheckRequest"], "metric" | "cost">> & { costs?: Costs };

/**
 * A reservation request as POST /v1/reservations takes it (API.md "Reservations"):
 * `amount` units held until committed, released or expired, or `amounts` of several
 * metrics at once. `metric` defaults to `requests` and `ttl_seconds` to 60 (the
 * generated type marks them required because the spec gives them defaults).
 * `idempotency_key` is generated when absent, so that a retry never holds twice.
 */
export type ReserveRequest = Omit<Schemas["ReservationRequest"], "metric" | "ttl_seconds" | "amount" | "amounts"> &
  Partial<Pick<Schemas["ReservationRequest"], "metric" | "ttl_seconds">> & { amount?: number; amounts?: Costs };

/** The state of a reservation: `held`, `committed`, `released` or `expired`. */
export type ReservationState = Schemas["ReservationState"];

/** One metric of a reservation of several: its amount, and once settled what it used and gave back. */
export interface ReservationMetric {
  metric: string;
  amount: number;
  used?: number;
  released?: number;
  over_reserved?: number;
}

/**
 * A reservation as Quotaplane answers it (API.md "Reservations"): `metric`, `amount`,
 * and once settled `used`, `released`, `over_reserved`; of several metrics, those
 * are its first's and `metrics` lists each (amountsOf and usedOf read them as maps).
 */
export type Reservation = Omit<Schemas["Reservation"], "levels" | "metrics"> & {
  metrics?: ReservationMetric[];
  levels?: LevelStatus[];
};

/** What a reservation holds per metric: `{ requests: 1, tokens: 4000 }`. */
export function amountsOf(r: Reservation): Costs {
  if (r.metrics?.length) return Object.fromEntries(r.metrics.map((m) => [m.metric, m.amount]));
  return { [r.metric]: r.amount };
}

/** What a settled reservation counted per metric (undefined while held). */
export function usedOf(r: Reservation): Costs | undefined {
  if (r.metrics?.length) return r.metrics.every((m) => m.used !== undefined) ? Object.fromEntries(r.metrics.map((m) => [m.metric, m.used!])) : undefined;
  return r.used === undefined ? undefined : { [r.metric]: r.used };
}

/**
 * The RateLimit header fields of a decision: the tightest level and window (on a
 * denial, the one that refused). Read from the legacy RateLimit-Limit, -Remaining and
 * -Reset when the answer has them, else from the draft-11 RateLimit field (limit from
 * the RateLimit-Policy item of the same name).
 */
export interface RateLimit {
  /** RateLimit-Limit (or the policy's q) */
  limit: number;
  /** RateLimit-Remaining (or RateLimit's r) */
  remaining: number;
  /** RateLimit-Reset (or RateLimit's t): seconds until the window frees room. */
  reset: number;
  /** The draft-11 policy's name ("user-minute"), when the answer had a RateLimit field. */
  policy?: string;
}

/** Who decided: Quotaplane, or the client's fail policy because Quotaplane could not. */
export type DecidedBy = "quotaplane" | "fail-policy";

/** The outcome of a check. */
export interface CheckOutcome {
  /** Whether the work may go ahead. */
  allowed: boolean;
  /**
   * `quotaplane` when Quotaplane answered (`result` is its answer); `fail-policy` when
   * it could not be reached or could not decide (5xx) and the client's fail policy
   * gave `allowed` (`unavailable` says why).
   */
  decidedBy: DecidedBy;
  /** Quotaplane's answer, when it decided. */
  result?: CheckResult;
  /** The RateLimit-* headers (computed from `result` for a batch's checks: rateLimitOf). */
  rateLimit?: RateLimit;
  /** The RateLimit-Policy field: one item per limit of the path (absent without it). */
  policies?: Policy[];
  /** When denied: seconds after which the same check can pass (Retry-After). */
  retryAfterSeconds?: number;
  /** The idempotency key sent (the caller's, or the one generated): every retry reused it. */
  idempotencyKey: string;
  /** Why Quotaplane did not decide, when the fail policy did. */
  unavailable?: QuotaplaneUnavailableError;
  /** Quotaplane-Warning: a plan in `warn` mode allowed what it would have denied. */
  warning?: string;
  /**
   * Decided in this process from a client lease (`leases: true`), with nothing sent:
   * `result.levels` are those of when the lease was taken, counting the whole lease as
   * used, and `idempotencyKey` names the lease and the check's number in it. Absent
   * when the server decided (`result.leased` is the server's own replica lease).
   */
  leased?: boolean;
}

/**
 * One check of a batch that Quotaplane refused to decide (4xx: invalid, unknown org or
 * metric, a user not registered, idempotency key reused): an error, not a denial, so
 * it has no `allowed`.
 */
export type BatchCheckError = { [K in Exclude<keyof CheckOutcome, "idempotencyKey">]?: undefined } & {
  idempotencyKey: string;
  error: QuotaplaneError;
};

/**
 * The outcome of one check of a batch: as a single check's (a check Quotaplane
 * answered 5xx is answered by the fail policy, as a single one), or a BatchCheckError.
 * Test `error` (or `allowed === true`) before reading the decision.
 */
export type BatchCheckOutcome = (CheckOutcome & { error?: undefined }) | BatchCheckError;

/** The outcome of a reservation request. */
export interface ReserveOutcome {
  /** Whether the work may go ahead. */
  allowed: boolean;
  decidedBy: DecidedBy;
  /** The held reservation (absent when denied, or when the fail policy decided). */
  reservation?: Reservation;
  /** On a denial, Quotaplane's answer, as a denied check's. */
  denied?: CheckResult;
  /** As a check's, from the headers or else from the levels (rateLimitOf). */
  rateLimit?: RateLimit;
  /** As a check's. */
  policies?: Policy[];
  retryAfterSeconds?: number;
  idempotencyKey: string;
  unavailable?: QuotaplaneUnavailableError;
  /** As a check's. */
  warning?: string;
}

/** What a fail policy function is told. */
export interface FailContext {
  operation: "check" | "reserve";
  /** The request, with the idempotency key that was sent. */
  request: CheckRequest | ReserveRequest;
  error: QuotaplaneUnavailableError;
}

/**
 * What to answer when Quotaplane cannot be reached or answers 5xx after every retry:
 * `open` allows, `closed` denies, a function decides (it may also throw, and the
 * error reaches the caller).
 */
export type FailPolicy = "open" | "closed" | ((ctx: FailContext) => boolean | Promise<boolean>);

/** The calls of a client, as its hooks name them. */
export type Operation = "check" | "checkBatch" | "reserve" | "commit" | "extend" | "release" | "getReservation" | "lease" | "settleLease" | (string & {});

/** What a `headers` function is told: the call it adds headers to. */
export interface CallInfo {
  operation: Operation;
  method: string;
  /** The API path, e.g. `/v1/check`. */
  path: string;
}

/**
 * Headers to send with every call: a record, or a function called once per call (its
 * attempts send the same), e.g. to propagate the active trace as `traceparent`:
 *
 * ```ts
 * import { context, propagation } from "@opentelemetry/api";
 * new QuotaplaneClient({ baseUrl, key, headers: () => {
 *   const h: Record<string, string> = {};
 *   propagation.inject(context.active(), h); // traceparent, tracestate
 *   return h;
 * } });
 * ```
 *
 * `Authorization` is the client's own and cannot be replaced.
 */
export type HeadersOption = Record<string, string> | ((call: CallInfo) => Record<string, string> | undefined);

/** What onAttempt is told, after each request sent. */
export interface AttemptEvent extends CallInfo {
  /** 1 for the first request of the call, 2 for its first retry, ... */
  attempt: number;
  /** The status Quotaplane answered, when it answered. */
  status?: number;
  /** Why no answer came (a network error, the attempt's timeout, the caller's abort). */
  error?: unknown;
  durationMs: number;
}

/** What onRetry is told, before the client waits to retry. */
export interface RetryEvent extends CallInfo {
  /** The attempt that failed. */
  attempt: number;
  /** How long the client waits before the next attempt. */
  delayMs: number;
  /** The 5xx of the failed attempt, when it answered one. */
  status?: number;
  /** Its network error, when it got no answer. */
  error?: unknown;
  /** The Retry-After of the failed attempt, in ms, when it had one (delayMs is then it). */
  retryAfterMs?: number;
}

/** What onDecision is told: each check's (a batch's too, one per check) and each reservation's outcome. */
export type DecisionEvent = { operation: "check"; outcome: CheckOutcome } | { operation: "reserve"; outcome: ReserveOutcome };

/** Options of a QuotaplaneClient. */
export interface ClientOptions {
  /** Where Quotaplane's API is, e.g. `https://quota.internal` (a path prefix is kept). */
  baseUrl: string;
  /** An org API key with the `check` scope. */
  key: string;
  /** How long one attempt may take, in ms (default 2000), never beyond what is left of the call's budget. */
  timeoutMs?: number;
  /**
   * How long a check, batch or reservation may take in all, attempts and waits between
   * them included, in ms (default 1000): when it is spent, or a Retry-After would go
   * beyond it, the fail policy answers at once. A call's `budgetMs` overrides it.
   */
  budgetMs?: number;
  /** The same for commit, extend, release and getReservation, which no request waits on (default 5000). */
  settleBudgetMs?: number;
  /** Attempts after the first when Quotaplane is unreachable, times out or answers 5xx (default 2), within the budget. */
  retries?: number;
  /**
   * What checks and reservations answer when Quotaplane cannot decide. Without one,
   * they throw the QuotaplaneUnavailableError: choose, as Go's client makes you.
   */
  failPolicy?: FailPolicy;
  /**
   * Backoff: the first retry waits up to retryDelayMs (default 100), each further one up
   * to twice as long, never more than maxRetryDelayMs (default 1000); the wait is drawn
   * between 0 and that ("full jitter"). A Retry-After is waited as Quotaplane says, not
   * capped, within the budget.
   */
  retryDelayMs?: number;
  /** The cap of the backoff (default 1000 ms); Retry-After is not capped by it. */
  maxRetryDelayMs?: number;
  /** The fetch to use (default globalThis.fetch). */
  fetch?: typeof fetch;
  /** Headers sent with every call (a `traceparent` function, say): HeadersOption. */
  headers?: HeadersOption;
  /** Called after each request sent (logging, metrics, a span per attempt). An exception of a hook is ignored. */
  onAttempt?: (e: AttemptEvent) => void;
  /** Called before each retry, with its wait. */
  onRetry?: (e: RetryEvent) => void;
  /** Called with each decision: Quotaplane's, or the fail policy's. */
  onDecision?: (e: DecisionEvent) => void;
  /**
   * Client leases (API.md "Client leases"): a path (org, team, user, metric) whose
   * checks in this process run above `leaseThreshold` units a second takes a lease, a
   * block of units the server sized and took from every level at once, and its checks
   * are decided in process from it (`leased: true`, nothing sent) until its units or
   * its life (at most a second) run out; each lease is settled with exactly what it
   * admitted. Checks with `costs`, a cost of 0, or an idempotency key of the caller's
   * always go to the server. `close()` settles every lease. Default false.
   */
  leases?: boolean;
  /** Units a second above which a path asks for a lease (default 50). */
  leaseThreshold?: number;
  /**
   * Coalescing: checks not decided from a lease that arrive within this many ms of the
   * first one waiting go out together as one POST /v1/check/batch (at most 100; a full
   * one at once). Each caller gets its own outcome or error, as a single check's (its
   * `rateLimit` is computed from the levels, and it has no `policies`). A call with
   * its own `headers` or `budgetMs` goes alone. Off when undefined.
   */
  batchWaitMs?: number;
  /** Called with each lease taken, refused, closed, settled, or failed (LeaseEvent). */
  onLease?: (e: LeaseEvent) => void;
}

/** Call options. */
export interface CallOptions {
  /**
   * Aborts the call: it rejects with a QuotaplaneAbortError (name "AbortError"), never
   * handed to the fail policy, since the caller gave up.
   */
  signal?: AbortSignal;
  /** This call's budget in ms, instead of the client's budgetMs (or settleBudgetMs). */
  budgetMs?: number;
  /** Headers of this call, over the client's `headers`. */
  headers?: Record<string, string>;
}

/**
 * What a QuotaplaneClient does, as an interface: the middlewares take the parts they
 * use (Pick<Quotaplane, "check">, ...) rather than the class, so a test passes a fake
 * (`@quotaplane/client/testing`) or its own object.
 */
export interface Quotaplane {
  check(req: CheckRequest, opts?: CallOptions): Promise<CheckOutcome>;
  checkBatch(reqs: CheckRequest[], opts?: CallOptions): Promise<BatchCheckOutcome[]>;
  reserve(req: ReserveRequest, opts?: CallOptions): Promise<ReserveOutcome>;
  commit(id: string, used: number | Costs, opts?: CallOptions): Promise<Reservation>;
  extend(id: string, ttlSeconds: number, opts?: CallOptions): Promise<Reservation>;
  release(id: string, opts?: CallOptions): Promise<Reservation>;
  getReservation(id: string, opts?: CallOptions): Promise<Reservation>;
}

interface Answer {
  status: number;
  headers: Headers;
  body: unknown;
}

// 5xx answers mean "nothing was decided" (503: Redis down under a closed plan; a
// proxy's 502 and 504): retried, then the fail policy. A retry is safe: the request
// carries its idempotency key.
function unavailable(status: number): boolean {
  return status >= 500 && status <= 599;
}

/** A fresh idempotency key: 40 characters of the API's alphabet. */
export function newIdempotencyKey(): string {
  return "qpc-" + globalThis.crypto.randomUUID();
}

/**
 * A client of Quotaplane's check and reservation API. Every call is retried when
 * Quotaplane is unreachable, slow or answers 5xx, reusing the request's
 * idempotency key, so a retry never counts twice, within the call's budget; a check
 * or reservation that still cannot be decided is answered by the fail policy, and
 * says so (`decidedBy`). A configuration error (QuotaplaneConfigError), a refusal
 * (QuotaplaneError) and the caller's abort (QuotaplaneAbortError) are thrown, never
 * retried nor handed to the fail policy.
 */
export class QuotaplaneClient implements Quotaplane {
  readonly #base: string;
  readonly #key: string;
  readonly #timeoutMs: number;
  readonly #budgetMs: number;
  readonly #settleBudgetMs: number;
  readonly #retries: number;
  readonly #failPolicy: FailPolicy | undefined;
  readonly #retryDelayMs: number;
  readonly #maxRetryDelayMs: number;
  readonly #fetch: typeof fetch;
  readonly #headers: HeadersOption | undefined;
  readonly #hooks: Pick<ClientOptions, "onAttempt" | "onRetry" | "onDecision">;
  readonly #leases: Leases | undefined;
  readonly #coalescer: Coalescer<CheckRequest & { idempotency_key: string }, CheckOutcome> | undefined;

  constructor(opts: ClientOptions) {
    if (!opts.baseUrl) throw new TypeError("QuotaplaneClient: baseUrl is required");
    if (!opts.key) throw new TypeError("QuotaplaneClient: key is required");
    if (!opts.fetch) {
      // A base URL that global fetch cannot use is a configuration error, said at once.
      let url: URL;
      try {
        url = new URL(opts.baseUrl);
      } catch (err) {
        throw new QuotaplaneConfigError(`QuotaplaneClient: baseUrl ${JSON.stringify(opts.baseUrl)} is not a URL`, { cause: err });
      }
      if (url.protocol !== "http:" && url.protocol !== "https:") {
        throw new QuotaplaneConfigError(`QuotaplaneClient: baseUrl ${JSON.stringify(opts.baseUrl)}: the scheme must be http or https`);
      }
    }
    this.#base = opts.baseUrl.replace(/\/+$/, "");
    this.#key = opts.key;
    this.#timeoutMs = opts.timeoutMs ?? 2000;
    this.#budgetMs = opts.budgetMs ?? 1000;
    this.#settleBudgetMs = opts.settleBudgetMs ?? 5000;
    this.#retries = Math.max(0, Math.floor(opts.retries ?? 2));
    this.#failPolicy = opts.failPolicy;
    this.#retryDelayMs = opts.retryDelayMs ?? 100;
    this.#maxRetryDelayMs = opts.maxRetryDelayMs ?? 1000;
    this.#fetch = opts.fetch ?? globalThis.fetch.bind(globalThis);
    this.#headers = opts.headers;
    this.#hooks = { onAttempt: opts.onAttempt, onRetry: opts.onRetry, onDecision: opts.onDecision };
    if (opts.leases) {
      const threshold = opts.leaseThreshold ?? 50;
      if (!(threshold >= 0)) throw new TypeError("QuotaplaneClient: leaseThreshold must be a number of units a second >= 0");
      this.#leases = new Leases(
        {
          post: async (path, body, budgetMs, retries) => {
            const ans = await this.#call("POST", path, body, { budgetMs }, path === "/v1/leases" ? "lease" : "settleLease", retries);
            if (ans.status !== 200 && ans.status !== 201) throw toError(ans);
            return ans.body;
          },
          budgetMs: this.#budgetMs,
          onLease: opts.onLease,
          onDecision: (outcome) => this.#decided({ operation: "check", outcome }),
        },
        threshold,
      );
    }
    if (opts.batchWaitMs !== undefined) {
      if (!(opts.batchWaitMs >= 0)) throw new TypeError("QuotaplaneClient: batchWaitMs must be a number of ms >= 0");
      this.#coalescer = new Coalescer(opts.batchWaitMs, (items) => this.#sendCoalesced(items));
    }
  }

  /**
   * Settles every client lease (renew false) and sends the checks waiting to be
   * coalesced, and waits for it, at most settleBudgetMs. Checks after close are
   * never leased.
   */
  async close(): Promise<void> {
    this.#coalescer?.flush(true);
    await this.#leases?.close(this.#settleBudgetMs);
  }

  /**
   * Asks whether `cost` units may be spent now, and counts them if so. Resolves
   * allowed or denied (429 is a denial, not an error); throws QuotaplaneError when
   * Quotaplane refuses the request itself (bad key, unknown metric, ...).
   */
  async check(req: CheckRequest, opts: CallOptions = {}): Promise<CheckOutcome> {
    if (this.#leases !== undefined && leasable(req)) {
      const got = this.#leases.admit(req, opts);
      if (got !== undefined) {
        const out = got instanceof Promise ? await got : got;
        if (out !== undefined) return out;
      }
    }
    const request = { ...req, idempotency_key: req.idempotency_key ?? newIdempotencyKey() };
    if (this.#coalescer !== undefined && opts.headers === undefined && opts.budgetMs === undefined) {
      return this.#coalescer.add(request, this.#budgetMs, opts.signal);
    }
    return this.#single(request, opts);
  }

  async #single(request: CheckRequest & { idempotency_key: string }, opts: CallOptions): Promise<CheckOutcome> {
    let ans: Answer;
    try {
      ans = await this.#call("POST", "/v1/check", request, opts, "check");
    } catch (err) {
      if (!(err instanceof QuotaplaneUnavailableError)) throw err;
      return this.#fallback("check", request, err);
    }
    if (ans.status !== 200 && ans.status !== 429) throw toError(ans);
    const result = ans.body as CheckResult;
    const out: CheckOutcome = {
      allowed: result.allowed,
      decidedBy: "quotaplane",
      result,
      rateLimit: rateLimitHeaders(ans.headers),
      policies: parsePolicies(ans.headers.get("RateLimit-Policy")),
      retryAfterSeconds: result.allowed ? undefined : (intHeader(ans.headers, "Retry-After") ?? result.retry_after_seconds),
      idempotencyKey: request.idempotency_key,
    };
    const warning = ans.headers.get("Quotaplane-Warning") ?? result.warning;
    if (warning) out.warning = warning;
    this.#decided({ operation: "check", outcome: out });
    return out;
  }

  /**
   * Checks up to 100 requests at once, each decided on its own, in order. When the
   * whole batch cannot be decided, the fail policy answers each check; so it does for
   * a check Quotaplane answered 5xx (503). A check Quotaplane refused (4xx) is a
   * BatchCheckError: `error`, no `allowed`.
   */
  async checkBatch(reqs: CheckRequest[], opts: CallOptions = {}): Promise<BatchCheckOutcome[]> {
    const checks = reqs.map((r) => ({ ...r, idempotency_key: r.idempotency_key ?? newIdempotencyKey() }));
    let ans: Answer;
    try {
      ans = await this.#call("POST", "/v1/check/batch", { checks }, opts, "checkBatch");
    } catch (err) {
      if (!(err instanceof QuotaplaneUnavailableError)) throw err;
      return Promise.all(checks.map((c) => this.#fallback("check", c, err)));
    }
    if (ans.status !== 200) throw toError(ans);
    const results = (ans.body as Schemas["BatchCheckResult"]).results;
    if (results.length !== checks.length) {
      throw new QuotaplaneError(502, problemOf(502, "Bad Gateway", `the batch answered ${results.length} results for ${checks.length} checks`));
    }
    return Promise.all(
      checks.map(async (c, i): Promise<BatchCheckOutcome> => {
        const item = results[i]!;
        if (!("allowed" in item)) {
          const problem = item as Problem;
          if (unavailable(problem.status)) return this.#fallback("check", c, itemUnavailable(i, problem));
          return { idempotencyKey: c.idempotency_key, error: new QuotaplaneError(problem.status, problem) };
        }
        return this.#itemOutcome(item as unknown as CheckResult, c.idempotency_key);
      }),
    );
  }

  #itemOutcome(result: CheckResult, idempotencyKey: string): CheckOutcome {
    const out: CheckOutcome = {
      allowed: result.allowed,
      decidedBy: "quotaplane",
      result,
      rateLimit: rateLimitOf(result),
      retryAfterSeconds: result.allowed ? undefined : result.retry_after_seconds,
      idempotencyKey,
    };
    if (result.warning) out.warning = result.warning;
    this.#decided({ operation: "check", outcome: out });
    return out;
  }

  // #sendCoalesced sends checks that waited together (coalesce.ts): one alone as a
  // single check, more as one batch, within the latest budget among them (an answer
  // that comes is given even a little late: the server may have counted it). Each
  // caller is answered as its single check would be: a 4xx item throws its
  // QuotaplaneError; a 5xx item is queued again after the backoff (same idempotency
  // key) while its budget and the retries allow, then the fail policy answers; a batch
  // refused with 400 (one check of it may be what was invalid; a refused request
  // counts nothing) is sent again check by check.
  async #sendCoalesced(items: Waiting<CheckRequest & { idempotency_key: string }, CheckOutcome>[]): Promise<void> {
    const now = performance.now();
    const alone = (w: (typeof items)[number]) =>
      this.#single(w.request, { budgetMs: Math.max(1, w.deadline - performance.now()), signal: w.signal }).then(w.resolve, w.reject);
    const deadline = Math.max(...items.map((w) => w.deadline));
    if (deadline <= now) {
      const err = new QuotaplaneUnavailableError(`quotaplane: the check's budget was spent before its batch could go out`, { attempts: 0 });
      for (const w of items) this.#fallback("check", w.request, err).then(w.resolve, w.reject);
      return;
    }
    if (items.length === 1) return alone(items[0]!);
    let ans: Answer;
    try {
      ans = await this.#call("POST", "/v1/check/batch", { checks: items.map((w) => w.request) }, { budgetMs: deadline - now }, "checkBatch");
    } catch (err) {
      for (const w of items) {
        if (err instanceof QuotaplaneUnavailableError) this.#fallback("check", w.request, err).then(w.resolve, w.reject);
        else w.reject(err);
      }
      return;
    }
    if (ans.status === 400) {
      await Promise.allSettled(items.map(alone));
      return;
    }
    const results = (ans.body as Schemas["BatchCheckResult"] | undefined)?.results;
    if (ans.status !== 200 || results?.length !== items.length) {
      const err = ans.status !== 200 ? toError(ans) : new QuotaplaneError(502, problemOf(502, "Bad Gateway", `the batch answered ${results?.length} results for ${items.length} checks`));
      return items.forEach((w) => w.reject(err));
    }
    items.forEach((w, i) => {
      const item = results[i]!;
      if ("allowed" in item) return w.resolve(this.#itemOutcome(item as unknown as CheckResult, w.request.idempotency_key));
      const problem = item as Problem;
      if (unavailable(problem.status)) {
        const delay = this.#backoff(w.attempts);
        if (w.attempts <= this.#retries && performance.now() + delay < w.deadline) return this.#coalescer!.requeue(w, delay);
        return void this.#fallback("check", w.request, itemUnavailable(i, problem)).then(w.resolve, w.reject);
      }
      w.reject(new QuotaplaneError(problem.status, problem));
    });
  }

  /**
   * Holds `amount` units for work whose cost is known only afterwards; commit the
   * units used, or release them. A denial (429) resolves with `allowed: false` and
   * holds nothing.
   */
  async reserve(req: ReserveRequest, opts: CallOptions = {}): Promise<ReserveOutcome> {
    const request = { ...req, idempotency_key: req.idempotency_key ?? newIdempotencyKey() };
    let ans: Answer;
    try {
      ans = await this.#call("POST", "/v1/reservations", request, opts, "reserve");
    } catch (err) {
      if (!(err instanceof QuotaplaneUnavailableError)) throw err;
      const allowed = await this.#policy({ operation: "reserve", request, error: err });
      const out: ReserveOutcome = { allowed, decidedBy: "fail-policy", idempotencyKey: request.idempotency_key, unavailable: err };
      this.#decided({ operation: "reserve", outcome: out });
      return out;
    }
    const rateLimit = rateLimitHeaders(ans.headers);
    const policies = parsePolicies(ans.headers.get("RateLimit-Policy"));
    let out: ReserveOutcome;
    if (ans.status === 200 || ans.status === 201) {
      const reservation = ans.body as Reservation;
      out = {
        allowed: true,
        decidedBy: "quotaplane",
        reservation,
        rateLimit: rateLimit ?? rateLimitOf({ allowed: true, levels: reservation.levels ?? [] }),
        policies,
        idempotencyKey: request.idempotency_key,
      };
    } else if (ans.status === 429) {
      const denied = ans.body as CheckResult;
      out = {
        allowed: false,
        decidedBy: "quotaplane",
        denied,
        rateLimit: rateLimit ?? rateLimitOf(denied),
        policies,
        retryAfterSeconds: intHeader(ans.headers, "Retry-After") ?? denied.retry_after_seconds,
        idempotencyKey: request.idempotency_key,
      };
    } else {
      throw toError(ans);
    }
    const warning = ans.headers.get("Quotaplane-Warning");
    if (warning) out.warning = warning;
    this.#decided({ operation: "reserve", outcome: out });
    return out;
  }

  /**
   * Counts `used` units of a held reservation and gives back the rest (more than
   * held is counted in full: `over_reserved`). A repeat answers the first commit;
   * after a release or expiry Quotaplane answers 409 (a QuotaplaneError).
   */
  async commit(id: string, used: number | Costs, opts: CallOptions = {}): Promise<Reservation> {
    return this.#reservation("commit", "POST", `/v1/reservations/${encodeURIComponent(id)}/commit`, { used }, opts);
  }

  /**
   * Keeps a held reservation `ttlSeconds` more from now (1 to 3600; a heartbeat of
   * long work, such as a stream holding a concurrency slot), answering its new
   * `expires_at`. Once settled or expired Quotaplane answers 409 (a QuotaplaneError).
   */
  async extend(id: string, ttlSeconds: number, opts: CallOptions = {}): Promise<Reservation> {
    const ttl = Math.max(1, Math.ceil(ttlSeconds));
    return this.#reservation("extend", "POST", `/v1/reservations/${encodeURIComponent(id)}/extend`, { ttl_seconds: ttl }, opts);
  }

  /** Gives back every unit of a held reservation. */
  async release(id: string, opts: CallOptions = {}): Promise<Reservation> {
    return this.#reservation("release", "DELETE", `/v1/reservations/${encodeURIComponent(id)}`, undefined, opts);
  }

  /** Reads a reservation's state. */
  async getReservation(id: string, opts: CallOptions = {}): Promise<Reservation> {
    return this.#reservation("getReservation", "GET", `/v1/reservations/${encodeURIComponent(id)}`, undefined, opts);
  }

  // Entitlements (entitlements.ts).

  /** The org's resolved features for `team` and `user` (either optional; an unknown team is a 404 QuotaplaneError). */
  async entitlements(org: string, team?: string, user?: string, opts: CallOptions = {}): Promise<Entitlements> {
    const ans = await this.#call("GET", entitlementsPath(org, team, user), undefined, opts, "entitlements");
    if (ans.status !== 200) throw toError(ans);
    return ans.body as Entitlements;
  }

  /** The value of `feature` for the org, team and user, or undefined when the org does not have it. */
  async feature(org: string, team: string | undefined, user: string | undefined, feature: string, opts: CallOptions = {}): Promise<FeatureValue | undefined> {
    return (await this.entitlements(org, team, user, opts)).features[feature];
  }

  /** Whether the org (for the team and user) has `feature`: present and not false, 0 or "". */
  async entitled(org: string, team: string | undefined, user: string | undefined, feature: string, opts: CallOptions = {}): Promise<boolean> {
    return grants(await this.feature(org, team, user, feature, opts));
  }

  async #reservation(operation: Operation, method: string, path: string, body: unknown, opts: CallOptions): Promise<Reservation> {
    const ans = await this.#call(method, path, body, { budgetMs: this.#settleBudgetMs, ...opts }, operation);
    if (ans.status !== 200) throw toError(ans);
    return ans.body as Reservation;
  }

  async #fallback(operation: "check", request: CheckRequest & { idempotency_key: string }, error: QuotaplaneUnavailableError): Promise<CheckOutcome> {
    const allowed = await this.#policy({ operation, request, error });
    const out: CheckOutcome = { allowed, decidedBy: "fail-policy", idempotencyKey: request.idempotency_key, unavailable: error };
    this.#decided({ operation: "check", outcome: out });
    return out;
  }

  async #policy(ctx: FailContext): Promise<boolean> {
    const p = this.#failPolicy;
    if (p === undefined) throw ctx.error;
    if (p === "open") return true;
    if (p === "closed") return false;
    return (await p(ctx)) === true;
  }

  // #backoff is the wait before the retry that follows attempt n: full jitter.
  #backoff(n: number): number {
    return Math.random() * Math.min(this.#maxRetryDelayMs, this.#retryDelayMs * 2 ** (n - 1));
  }

  #decided(e: DecisionEvent): void {
    hook(this.#hooks.onDecision, e);
  }

  // #call sends one request, retrying while Quotaplane is unreachable, slow or
  // answers 5xx, within the call's budget (opts.budgetMs, else the client's budgetMs);
  // it throws QuotaplaneUnavailableError when every attempt failed so or the budget
  // is spent (or a Retry-After goes beyond it), QuotaplaneConfigError at once on an
  // error retrying cannot mend, QuotaplaneAbortError when the caller aborts, and
  // returns any other answer.
  async #call(method: string, path: string, body: unknown, opts: CallOptions, operation: Operation = `${method} ${path}`, retries = this.#retries): Promise<Answer> {
    const info: CallInfo = { operation, method, path };
    const budget = opts.budgetMs ?? this.#budgetMs;
    const deadline = performance.now() + budget;
    const extra = typeof this.#headers === "function" ? this.#headers(info) : this.#headers;
    const headers: Record<string, string> = {
      "User-Agent": `quotaplane-ts/${VERSION}`,
      Accept: "application/json, application/problem+json",
      ...(body !== undefined ? { "Content-Type": "application/json" } : {}),
      ...extra,
      ...opts.headers,
      Authorization: `Bearer ${this.#key}`,
    };
    const payload = body === undefined ? undefined : JSON.stringify(body);
    const caller = opts.signal;
    if (caller?.aborted) throw new QuotaplaneAbortError(caller.reason);
    for (let attempt = 1; ; attempt++) {
      let last: ConstructorParameters<typeof QuotaplaneUnavailableError>[1];
      let retryAfterMs: number | undefined;
      const timeout = AbortSignal.timeout(Math.max(1, Math.ceil(Math.min(this.#timeoutMs, deadline - performance.now()))));
      const signal = caller ? AbortSignal.any([caller, timeout]) : timeout;
      const started = performance.now();
      try {
        const res = await this.#fetch(this.#base + path, { method, headers, body: payload, signal });
        const text = await res.text();
        hook(this.#hooks.onAttempt, { ...info, attempt, status: res.status, durationMs: performance.now() - started });
        const ans: Answer = { status: res.status, headers: res.headers, body: parseBody(text) };
        if (!unavailable(res.status)) return ans;
        retryAfterMs = retryAfter(res.headers.get("Retry-After"));
        last = {
          attempts: attempt,
          status: res.status,
          problem: asProblem(ans),
          retryAfterSeconds: retryAfterMs === undefined ? undefined : Math.ceil(retryAfterMs / 1000),
        };
      } catch (err) {
        hook(this.#hooks.onAttempt, { ...info, attempt, error: err, durationMs: performance.now() - started });
        if (caller?.aborted) throw new QuotaplaneAbortError(caller.reason);
        if (isConfigError(err)) {
          throw new QuotaplaneConfigError(`quotaplane: ${method} ${this.#base}${path}: ${describe(err)} (a configuration error: not retried)`, { cause: err });
        }
        last = { attempts: attempt, cause: err };
      }
      const left = deadline - performance.now();
      const why = last.status !== undefined ? `answered ${last.status}` : `unreachable (${describe(last.cause)})`;
      if (attempt > retries) {
        throw new QuotaplaneUnavailableError(`quotaplane: ${method} ${path} ${why} on ${attempt} attempt(s)`, last);
      }
      const delay = retryAfterMs ?? this.#backoff(attempt);
      if (left <= 0 || delay >= left) {
        const wait = retryAfterMs !== undefined ? `Retry-After ${Math.round(retryAfterMs)} ms goes beyond` : "no time left of";
        throw new QuotaplaneUnavailableError(`quotaplane: ${method} ${path} ${why} on ${attempt} attempt(s); ${wait} its ${budget} ms budget`, last);
      }
      const ev: RetryEvent = { ...info, attempt, delayMs: delay };
      if (last.status !== undefined) ev.status = last.status;
      if (last.cause !== undefined) ev.error = last.cause;
      if (retryAfterMs !== undefined) ev.retryAfterMs = retryAfterMs;
      hook(this.#hooks.onRetry, ev);
      try {
        await sleep(delay, caller);
      } catch {
        throw new QuotaplaneAbortError(caller?.reason);
      }
    }
  }
}

// hook calls one of the client's hooks; what it throws is ignored, so that a broken
// logger cannot change a decision.
function hook<E>(fn: ((e: E) => void) | undefined, e: E): void {
  if (!fn) return;
  try {
    fn(e);
  } catch {
    // ignored: see the options' doc
  }
}

// isConfigError tells an error that retrying cannot mend from a network failure that
// may pass. fetch throws a TypeError for both: its cause has a system error code for a
// connection refused, reset or timed out (retried), and none for a scheme or port fetch
// refuses; a name that does not resolve and TLS failures have codes of their own.
// EAI_AGAIN (a resolver that did not answer) may pass, and is retried.
export function isConfigError(err: unknown): boolean {
  if (!(err instanceof TypeError)) return false;
  const cause = (err as { cause?: unknown }).cause;
  const code = typeof cause === "object" && cause !== null ? (cause as { code?: unknown }).code : undefined;
  if (typeof code !== "string") return true; // "unknown scheme", "bad port", a URL that does not parse
  return code === "ENOTFOUND" || code === "ERR_INVALID_URL" || /^(ERR_TLS_|ERR_SSL_|CERT_|UNABLE_TO_|DEPTH_ZERO_|SELF_SIGNED_|HOSTNAME_|ERR_INVALID_)/.test(code) || code === "EPROTO";
}

// retryAfter reads a Retry-After field: delay-seconds, or an HTTP date; in ms.
function retryAfter(v: string | null): number | undefined {
  if (v === null) return undefined;
  if (/^\s*\d+\s*$/.test(v)) return Number(v) * 1000;
  const at = Date.parse(v);
  if (Number.isNaN(at)) return undefined;
  return Math.max(0, at - Date.now());
}

function describe(err: unknown): string {
  if (err instanceof Error) {
    const cause = err.cause instanceof Error ? `: ${err.cause.message}` : "";
    return `${err.message}${cause}`;
  }
  return String(err);
}

function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

function parseBody(text: string): unknown {
  if (text === "") return undefined;
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

function problemOf(status: number, title: string, detail?: string): Problem {
  const p: Problem = { type: "about:blank", title, status };
  if (detail !== undefined) p.detail = detail;
  return p;
}

function asProblem(ans: Answer): Problem {
  const b = ans.body;
  if (typeof b === "object" && b !== null && typeof (b as Problem).title === "string" && typeof (b as Problem).status === "number") {
    return b as Problem;
  }
  return problemOf(ans.status, `HTTP ${ans.status}`, typeof b === "string" ? b.slice(0, 200) : undefined);
}

// itemUnavailable is the error of a batch's check that Quotaplane answered 5xx.
function itemUnavailable(i: number, problem: Problem): QuotaplaneUnavailableError {
  return new QuotaplaneUnavailableError(`quotaplane: check ${i} of the batch: ${problem.status} ${problem.title}`, { attempts: 1, status: problem.status, problem });
}

function toError(ans: Answer): QuotaplaneError {
  return new QuotaplaneError(ans.status, asProblem(ans));
}

function intHeader(h: Headers, name: string): number | undefined {
  const v = h.get(name);
  if (v === null || !/^\s*\d+\s*$/.test(v)) return undefined;
  return Number(v);
}

/**
 * The RateLimit of an answer's headers: the legacy fields when present (with the
 * draft's policy name when it has one), else the draft-11 RateLimit field's first
 * item, its limit the q of the RateLimit-Policy item of the same name.
 */
export function rateLimitHeaders(h: Headers): RateLimit | undefined {
  const item = parseServiceLimits(h.get("RateLimit"))?.[0];
  const limit = intHeader(h, "RateLimit-Limit");
  const remaining = intHeader(h, "RateLimit-Remaining");
  const reset = intHeader(h, "RateLimit-Reset");
  if (limit !== undefined && remaining !== undefined && reset !== undefined) {
    return item ? { limit, remaining, reset, policy: item.name } : { limit, remaining, reset };
  }
  if (!item) return undefined;
  const policy = parsePolicies(h.get("RateLimit-Policy"))?.find((p) => p.name === item.name);
  return { limit: policy?.quota ?? 0, remaining: item.remaining, reset: item.reset ?? 0, policy: item.name };
}

/**
 * The RateLimit-* values Quotaplane would send for a result (a batch's and a
 * reservation's have no headers): the level and window with the least remaining, then
 * the soonest reset; on a denial, the one that refused, resetting at
 * retry_after_seconds.
 */
export function rateLimitOf(
  result: Pick<CheckResult, "allowed" | "levels" | "blocked_at" | "retry_after_seconds">,
  now: Date = new Date(),
): RateLimit | undefined {
  const levels = result.levels;
  let t = levels[0];
  if (t === undefined) return undefined;
  for (const l of levels.slice(1)) {
    if (l.remaining < t.remaining || (l.remaining === t.remaining && Date.parse(l.reset_at) < Date.parse(t.reset_at))) t = l;
  }
  let reset = Math.ceil((Date.parse(t.reset_at) - now.getTime()) / 1000);
  const b = result.blocked_at;
  if (!result.allowed && b) {
    t = levels.find((l) => l.level === b.level && l.id === b.id && l.window === b.window && (!b.metric || !l.metric || l.metric === b.metric)) ?? t;
    if (result.retry_after_seconds !== undefined) reset = result.retry_after_seconds;
  }
  return { limit: t.limit, remaining: Math.max(t.remaining, 0), reset: Math.max(reset, 0) };
}

/** QuotaplaneClient, by the name API.md "Client leases" gives it: `new Client({ ..., leases: true })`. */
export const Client = QuotaplaneClient;
/** QuotaplaneClient. */
export type Client = QuotaplaneClient;
