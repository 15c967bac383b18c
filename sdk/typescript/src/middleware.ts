import type { IncomingMessage, ServerResponse } from "node:http";

import { QuotaplaneError, QuotaplaneUnavailableError } from "./errors.js";
import { formatPolicies, formatServiceLimit, type Policy } from "./ratelimit.js";
import { amountsOf, type CheckOutcome, type CheckRequest, type Costs, type QuotaplaneClient, type RateLimit, type Reservation, type ReserveOutcome, type ReserveRequest } from "./client.js";

/** The part of a response the middleware uses: node's ServerResponse and Express's Response have it. */
export interface ResponseLike {
  statusCode: number;
  headersSent: boolean;
  setHeader(name: string, value: string | number): unknown;
  end(body?: string): unknown;
  once(event: "finish" | "close" | "error", listener: () => void): unknown;
}

/** Express's next: called with nothing to go on, with an error to hand it to the error handlers. */
export type Next = (err?: unknown) => void;

/** A (req, res, next) middleware, as Express, Connect and similar routers take it. */
export type Middleware<Req, Res> = (req: Req, res: Res, next: Next) => void;

/**
 * What a middleware does when the client threw instead of deciding: Quotaplane refused
 * the call itself (a QuotaplaneError: 400, 404, 422 of what the request named, 401 or
 * 403 of the service's key), or could not be reached and the client has no fail
 * policy (a QuotaplaneUnavailableError).
 *
 * - `"answer"` (the default): answer the caller with a problem+json (answerError),
 *   never handing Quotaplane's answer to the router (Express would answer 500 with an
 *   HTML stack trace);
 * - `"next"`: next(err) with a QuotaplaneMiddlewareError, for the app's error handlers;
 * - a function: called with the QuotaplaneMiddlewareError (its `cause` is the client's
 *   error) to answer as the app likes, or to call next.
 */
export type OnQuotaplaneError<Req, Res> = "answer" | "next" | ((err: QuotaplaneMiddlewareError, req: Req, res: Res, next: Next) => void);

/** The option every middleware takes about the client's errors. */
export interface ErrorOptions<Req, Res> {
  /** What to do when the client threw (default "answer": a problem+json to the caller). */
  onError?: OnQuotaplaneError<Req, Res>;
}

/** Options of checkMiddleware. */
export interface CheckMiddlewareOptions<Req, Res = ServerResponse> extends ErrorOptions<Req, Res> {
  /** Maps a request to its check; null or undefined lets the request through unchecked. */
  check: (req: Req) => CheckRequest | null | undefined | Promise<CheckRequest | null | undefined>;
}

/**
 * A middleware that checks each request before its handler: an allowed check sets
 * RateLimit-* and calls next(); a denied one answers 429 with Retry-After, RateLimit-*
 * and a problem+json body, and the handler never runs. When the fail policy refused
 * the request (Quotaplane unreachable), it answers 503. An error of the check itself
 * (a user that is not registered and no team named, a bad key, an unknown metric;
 * Quotaplane unreachable when the client has no fail policy) is answered as `onError`
 * says: by default a problem+json (answerError), never the router's error page.
 */
export function checkMiddleware<Req = IncomingMessage, Res extends ResponseLike = ServerResponse>(
  client: QuotaplaneClient,
  opts: CheckMiddlewareOptions<Req, Res>,
): Middleware<Req, Res> {
  const run = async (req: Req, res: Res): Promise<boolean> => {
    const input = await opts.check(req);
    if (!input) return true;
    const out = await client.check(input).catch(wrap);
    if (!out.allowed) {
      refuse(res, out);
      return false;
    }
    setRateLimit(res, out.rateLimit, out.policies);
    return true;
  };
  return (req, res, next) => {
    run(req, res).then((go) => go && next(), (err: unknown) => failed(err, req, res, next, opts.onError));
  };
}

/** What a handler under reserveMiddleware reports, and how its reservation ended. */
export interface Settled {
  /** The reservation held for the request (absent when the fail policy let it through). */
  reservation?: Reservation;
  /** The units the handler reported, when it did (per metric, of a reservation of several). */
  used?: number | Costs;
  /** The reservation after its commit or release. */
  result?: Reservation;
  /** Why the commit or release failed. */
  error?: unknown;
}

/** Options of reserveMiddleware. */
export interface ReserveMiddlewareOptions<Req, Res = ServerResponse> extends ErrorOptions<Req, Res> {
  /** Maps a request to its reservation (the most it may spend); null or undefined lets it through. */
  reserve: (req: Req) => ReserveRequest | null | undefined | Promise<ReserveRequest | null | undefined>;
  /**
   * What to do when the handler reported no usage (reportUsage) by the end of the
   * response: `commit` the whole amount held (the default: work done, cost unknown),
   * or `release` it.
   */
  unreported?: "commit" | "release";
  /** Called once the reservation is committed or released, or that failed. */
  onSettled?: (s: Settled, req: Req) => void;
}

const usage = new WeakMap<object, number | Costs>();

/**
 * Tells reserveMiddleware (or concurrencyMiddleware) how many units the request used
 * (LLM tokens, GPU seconds): committed when the response ends, the rest of the
 * reservation given back. Of a reservation of several metrics (`amounts`), the units
 * per metric (`{ requests: 1, tokens: 1234 }`; a metric left out used 0). A later call
 * replaces an earlier one.
 */
export function reportUsage(res: object, used: number | Costs): void {
  const check = (n: unknown, what: string) => {
    if (typeof n !== "number" || !Number.isInteger(n) || n < 0) throw new RangeError(`reportUsage: ${what} must be a whole number >= 0, not ${String(n)}`);
  };
  if (typeof used === "number") check(used, "used");
  else for (const [m, n] of Object.entries(used)) check(n, `used of ${m}`);
  usage.set(res, typeof used === "number" ? used : { ...used });
}

/** The reservation id of the request of `res` under concurrencyMiddleware (undefined outside it). */
export function reservationId(res: object): string | undefined {
  return slotIds.get(res);
}
const slotIds = new WeakMap<object, string>();

/**
 * A middleware that reserves before the handler and commits after it: the request is
 * refused as checkMiddleware refuses it when the reservation is denied; otherwise the
 * handler runs and reports its cost with reportUsage(res, used), and when the
 * response ends (finished or closed) the reservation is committed with that cost, or
 * settled as `unreported` says.
 */
export function reserveMiddleware<Req = IncomingMessage, Res extends ResponseLike = ServerResponse>(
  client: QuotaplaneClient,
  opts: ReserveMiddlewareOptions<Req, Res>,
): Middleware<Req, Res> {
  const unreported = opts.unreported ?? "commit";
  const run = async (req: Req, res: Res): Promise<boolean> => {
    const input = await opts.reserve(req);
    if (!input) return true;
    const out = await client.reserve(input).catch(wrap);
    if (!out.allowed) {
      refuse(res, out);
      return false;
    }
    setRateLimit(res, out.rateLimit, out.policies);
    const reservation = out.reservation;
    if (reservation) {
      let done = false;
      const settle = () => {
        if (done) return;
        done = true;
        const used = usage.get(res);
        const s: Settled = { reservation };
        if (used !== undefined) s.used = used;
        const p =
          used !== undefined
            ? client.commit(reservation.id, used)
            : unreported === "commit"
              ? client.commit(reservation.id, reservation.metrics?.length ? amountsOf(reservation) : reservation.amount)
              : client.release(reservation.id);
        p.then(
          (r) => opts.onSettled?.({ ...s, result: r }, req),
          (error: unknown) => {
            if (opts.onSettled) opts.onSettled({ ...s, error }, req);
            else console.error(`quotaplane: settling reservation ${reservation.id}:`, error);
          },
        );
      };
      res.once("finish", settle);
      res.once("close", settle);
    }
    return true;
  };
  return (req, res, next) => {
    run(req, res).then((go) => go && next(), (err: unknown) => failed(err, req, res, next, opts.onError));
  };
}

/** Options of concurrencyMiddleware. */
export interface ConcurrencyMiddlewareOptions<Req, Res = ServerResponse> extends ErrorOptions<Req, Res> {
  /**
   * Maps a request to the slot it holds: a reservation, e.g. `{ org, user, metric:
   * "requests", amount: 1 }`, or `amounts` of requests and tokens at once.
   * `ttl_seconds` defaults to 30 and `on_expiry` to `release`. Null or undefined lets
   * the request through holding nothing.
   */
  reserve: (req: Req) => ReserveRequest | null | undefined | Promise<ReserveRequest | null | undefined>;
  /** How often a running request's reservation is extended, in ms (default: a third of its ttl). */
  heartbeatMs?: number;
  /** Called once the slot is given back (committed or released), or that failed. */
  onSettled?: (s: Settled, req: Req) => void;
  /** Called when an extend fails (default: console.warn); a 409 (the slot was settled or expired) or 404 stops the heartbeat. */
  onExtendError?: (err: unknown, req: Req) => void;
}

/** The ttl of a slot whose reservation sets none, in seconds. */
export const DEFAULT_SLOT_TTL_SECONDS = 30;

/**
 * A middleware that holds a slot (a reservation, typically against a `concurrent`
 * limit: API.md "Concurrency limits") for as long as the request is handled. A denied
 * reservation is refused as checkMiddleware refuses a check (429 with Retry-After, or
 * 503 when the fail policy refused). While the handler runs the reservation is
 * extended every heartbeat, so a stream longer than the ttl keeps its slot and a
 * process that dies loses it within a ttl. The slot is given back once, at the first
 * of: the response finished (success, or an error the error handler answered: an
 * exception, next(err)), the connection closed before that (the client went away),
 * or a response error. Given back means released, unless the handler reported usage
 * (reportUsage): then that is committed, which gives the slot back all the same.
 */
export function concurrencyMiddleware<Req = IncomingMessage, Res extends ResponseLike = ServerResponse>(
  client: QuotaplaneClient,
  opts: ConcurrencyMiddlewareOptions<Req, Res>,
): Middleware<Req, Res> {
  const run = async (req: Req, res: Res): Promise<boolean> => {
    const input = await opts.reserve(req);
    if (!input) return true;
    const ttl = input.ttl_seconds ?? DEFAULT_SLOT_TTL_SECONDS;
    const out = await client.reserve({ ...input, ttl_seconds: ttl, on_expiry: input.on_expiry ?? "release" }).catch(wrap);
    if (!out.allowed) {
      refuse(res, out);
      return false;
    }
    setRateLimit(res, out.rateLimit, out.policies);
    const reservation = out.reservation;
    if (!reservation) return true; // the fail policy let it through: nothing is held
    slotIds.set(res, reservation.id);
    const every = Math.max(10, Math.round(opts.heartbeatMs ?? Math.max(100, (ttl * 1000) / 3)));
    // Each extend is bounded by the heartbeat, and aborted when the slot is given back.
    const stop = new AbortController();
    let beating = false;
    const timer = setInterval(() => {
      if (beating) return;
      beating = true;
      client
        .extend(reservation.id, ttl, { signal: AbortSignal.any([stop.signal, AbortSignal.timeout(every)]) })
        .catch((err: unknown) => {
          if (stop.signal.aborted) return;
          if (err instanceof QuotaplaneError && (err.status === 409 || err.status === 404)) clearInterval(timer);
          if (opts.onExtendError) opts.onExtendError(err, req);
          else console.warn(`quotaplane: extending slot ${reservation.id}:`, err);
        })
        .finally(() => (beating = false));
    }, every);
    timer.unref?.();
    let done = false;
    const settle = () => {
      if (done) return;
      done = true;
      clearInterval(timer);
      stop.abort();
      const used = usage.get(res);
      const s: Settled = { reservation };
      if (used !== undefined) s.used = used;
      const p = used !== undefined ? client.commit(reservation.id, used) : client.release(reservation.id);
      p.then(
        (r) => opts.onSettled?.({ ...s, result: r }, req),
        (error: unknown) => {
          if (opts.onSettled) opts.onSettled({ ...s, error }, req);
          else console.error(`quotaplane: giving back slot ${reservation.id}:`, error);
        },
      );
    };
    res.once("finish", settle);
    res.once("close", settle);
    res.once("error", settle);
    return true;
  };
  return (req, res, next) => {
    run(req, res).then((go) => go && next(), (err: unknown) => failed(err, req, res, next, opts.onError));
  };
}

/**
 * What the middleware hands to onError (or next(err), with onError "next") when the
 * client threw: a QuotaplaneError
 * (a bad key, an unknown metric: the service's configuration, not its caller's
 * request) as the `cause` of a plain error, so that Express does not answer the
 * caller with Quotaplane's status (its default handler uses err.status).
 */
export class QuotaplaneMiddlewareError extends Error {
  override readonly name = "QuotaplaneMiddlewareError";
  /** The client's error. */
  declare readonly cause: QuotaplaneError | QuotaplaneUnavailableError;
  constructor(cause: QuotaplaneError | QuotaplaneUnavailableError) {
    super(`quotaplane middleware: ${cause.message}`, { cause });
  }
}

// failed handles what run threw: the client's errors as onError says, anything else
// (the app's own check or reserve function threw) to next(err) as before.
function failed<Req, Res extends ResponseLike>(err: unknown, req: Req, res: Res, next: Next, onError: OnQuotaplaneError<Req, Res> | undefined): void {
  if (!(err instanceof QuotaplaneMiddlewareError)) return next(err);
  if (onError === "next") return next(err);
  if (typeof onError === "function") return onError(err, req, res, next);
  answerError(res, err);
}

/**
 * answerError answers the caller for a client error the middleware met (onError
 * "answer"), with a problem+json and no stack trace:
 *
 * - Quotaplane refused what the request named (400, 404, 409, 422: a user that is not
 *   registered and no team, an unknown org, team or metric): 403, with Quotaplane's
 *   detail, since the caller is not one the quota knows;
 * - Quotaplane refused the service's own key (401, 403): 500, without the detail (the
 *   caller cannot fix it; console.error says it for the operator);
 * - Quotaplane could not be reached and the client has no fail policy: 503 with
 *   Retry-After, as a fail policy's refusal.
 */
export function answerError(res: ResponseLike, err: QuotaplaneMiddlewareError): void {
  if (res.headersSent) return;
  const cause = err.cause;
  let body: Record<string, unknown>;
  if (cause instanceof QuotaplaneError && cause.status !== 401 && cause.status !== 403) {
    res.statusCode = 403;
    body = {
      type: "https://quotaplane.dev/problems/quota-refused",
      title: "Forbidden",
      status: 403,
      detail: `the quota service refused this request: ${cause.problem.detail ?? cause.problem.title}`,
      quota_status: cause.status,
    };
    if (cause.problem.errors) body.errors = cause.problem.errors;
  } else if (cause instanceof QuotaplaneError) {
    console.error(`quotaplane middleware: ${cause.message} (the service's API key)`);
    res.statusCode = 500;
    body = {
      type: "https://quotaplane.dev/problems/quota-misconfigured",
      title: "Internal Server Error",
      status: 500,
      detail: "the quota service refused this service's credentials",
    };
  } else {
    body = unavailable(res, cause.retryAfterSeconds);
  }
  res.setHeader("Content-Type", "application/problem+json");
  res.setHeader("Cache-Control", "no-store");
  res.end(JSON.stringify(body));
}

function wrap(err: unknown): never {
  if (err instanceof QuotaplaneError || err instanceof QuotaplaneUnavailableError) throw new QuotaplaneMiddlewareError(err);
  throw err;
}

// setRateLimit passes Quotaplane's limits on to the caller in both generations: the
// draft-11 RateLimit-Policy (every policy of the path) and RateLimit (the tightest), when
// Quotaplane sent them, and the legacy RateLimit-Limit, -Remaining and -Reset.
function setRateLimit(res: ResponseLike, rl: RateLimit | undefined, policies?: Policy[]): void {
  if (!rl || res.headersSent) return;
  if (policies?.length) res.setHeader("RateLimit-Policy", formatPolicies(policies));
  if (rl.policy) res.setHeader("RateLimit", formatServiceLimit(rl.policy, rl.remaining, rl.reset));
  res.setHeader("RateLimit-Limit", String(rl.limit));
  res.setHeader("RateLimit-Remaining", String(rl.remaining));
  res.setHeader("RateLimit-Reset", String(rl.reset));
}

// refuse answers a request the check or reservation did not allow: 429 when Quotaplane
// denied it, 503 when the fail policy did (nothing was decided about the quota).
function refuse(res: ResponseLike, out: CheckOutcome | ReserveOutcome): void {
  if (res.headersSent) return;
  let body: Record<string, unknown>;
  if (out.decidedBy === "quotaplane") {
    const result = "denied" in out ? out.denied : (out as CheckOutcome).result;
    const retry = out.retryAfterSeconds ?? 1;
    const b = result?.blocked_at;
    res.statusCode = 429;
    res.setHeader("Retry-After", String(retry));
    setRateLimit(res, out.rateLimit, out.policies);
    body = {
      type: "https://quotaplane.dev/problems/too-many-requests",
      title: "Too Many Requests",
      status: 429,
      detail: b ? `over quota at ${b.level} "${b.id}" (${b.window}); retry after ${retry} s` : `over quota; retry after ${retry} s`,
      retry_after_seconds: retry,
    };
    if (b) body.blocked_at = b;
  } else {
    body = unavailable(res, out.unavailable?.retryAfterSeconds);
  }
  res.setHeader("Content-Type", "application/problem+json");
  res.setHeader("Cache-Control", "no-store");
  res.end(JSON.stringify(body));
}

// unavailable sets the status and Retry-After of a 503 (the quota service could not be
// reached or decide) and returns its problem document.
function unavailable(res: ResponseLike, retryAfterSeconds: number | undefined): Record<string, unknown> {
  res.statusCode = 503;
  res.setHeader("Retry-After", String(retryAfterSeconds ?? 1));
  return {
    type: "https://quotaplane.dev/problems/service-unavailable",
    title: "Service Unavailable",
    status: 503,
    detail: "the quota service cannot be reached; retry later",
  };
}
