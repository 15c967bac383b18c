import type { IncomingMessage, ServerResponse } from "node:http";

import { QuotaplaneAbortError, QuotaplaneConfigError, QuotaplaneError, QuotaplaneUnavailableError } from "./errors.js";
import { formatPolicies, formatServiceLimit, type Policy } from "./ratelimit.js";
import { amountsOf, type CheckOutcome, type CheckRequest, type Costs, type Quotaplane, type RateLimit, type Reservation, type ReserveOutcome, type ReserveRequest } from "./client.js";

/** The part of a response the middleware uses: node's ServerResponse and Express's Response have it. */
export interface ResponseLike {
  statusCode: number;
  headersSent: boolean;
  /** True once end() was called (node's ServerResponse has it). */
  writableEnded?: boolean;
  /** True once the response was flushed whole (node's ServerResponse has it). */
  writableFinished?: boolean;
  setHeader(name: string, value: string | number): unknown;
  end(body?: string): unknown;
  once(event: "finish" | "close", listener: () => void): unknown;
  removeListener?(event: "close", listener: () => void): unknown;
}

/** Express's next: called with nothing to go on, with an error to hand it to the error handlers. */
export type Next = (err?: unknown) => void;

/** A (req, res, next) middleware, as Express, Connect and similar routers take it. */
export type Middleware<Req, Res> = (req: Req, res: Res, next: Next) => void;

/**
 * The decision a middleware made for a request, put on it as `req.quotaplane` before
 * the handler (or onDenied) runs, as express-rate-limit puts `req.rateLimit`: the
 * check's or reservation's outcome (`allowed`, `decidedBy`, `rateLimit`, `result`,
 * `reservation`, `warning`, ...) and which middleware made it. Absent when the request
 * was skipped. Its type is on Express's Request (`req.quotaplane`); for another router,
 * `decisionOf(req)`.
 */
export type QuotaplaneDecision = ({ operation: "check" } & CheckOutcome) | ({ operation: "reserve" } & ReserveOutcome);

declare global {
  // eslint-disable-next-line @typescript-eslint/no-namespace
  namespace Express {
    interface Request {
      /** The decision of Quotaplane's middleware for this request (QuotaplaneDecision); absent when it skipped it. */
      quotaplane?: QuotaplaneDecision;
    }
  }
}

/** The decision of Quotaplane's middleware for a request (`req.quotaplane`), when one was made. */
export function decisionOf(req: object): QuotaplaneDecision | undefined {
  return (req as { quotaplane?: QuotaplaneDecision }).quotaplane;
}

/** Where the middlewares say what an operator must see (default: console). */
export interface Logger {
  warn(message: string, ...args: unknown[]): void;
  error(message: string, ...args: unknown[]): void;
}

/**
 * What a middleware does when the client threw instead of deciding: Quotaplane refused
 * the call itself (a QuotaplaneError: 400, 404, 422 of what the request named, 401 or
 * 403 of the service's key), the client is misconfigured (a QuotaplaneConfigError), or
 * Quotaplane could not be reached and the client has no fail policy (a
 * QuotaplaneUnavailableError).
 *
 * - `"answer"` (the default): log it (`logger`) and answer the caller with a
 *   problem+json (answerError), never handing it to the router (Express would answer
 *   500 with an HTML stack trace);
 * - `"next"`: next(err) with a QuotaplaneMiddlewareError, for the app's error handlers;
 * - a function: called with the QuotaplaneMiddlewareError (its `cause` is the client's
 *   error) to answer as the app likes, or to call next.
 */
export type OnQuotaplaneError<Req, Res> = "answer" | "next" | ((err: QuotaplaneMiddlewareError, req: Req, res: Res, next: Next) => void);

/** The options every middleware takes. */
export interface MiddlewareOptions<Req, Res> {
  /** Requests to let through without asking Quotaplane (health checks, an allowlist): nothing is counted or held, `req.quotaplane` is unset. */
  skip?: (req: Req, res: Res) => boolean | Promise<boolean>;
  /**
   * Answers a request that was not allowed, instead of the default (answerDenied: 429
   * with Retry-After, RateLimit-* and a problem+json when Quotaplane denied it, 503 when
   * the fail policy refused it: `decision.decidedBy` says which). It may also call
   * next() to let the request through, or next(err).
   */
  onDenied?: (decision: QuotaplaneDecision, req: Req, res: Res, next: Next) => void;
  /** What to do when the client threw (default "answer": logged, and a problem+json to the caller). */
  onError?: OnQuotaplaneError<Req, Res>;
  /** Where errors are logged (default console). */
  logger?: Logger;
}

/** Options of checkMiddleware. */
export interface CheckMiddlewareOptions<Req, Res = ServerResponse> extends MiddlewareOptions<Req, Res> {
  /** Maps a request to its check; null or undefined lets the request through unchecked. */
  check: (req: Req) => CheckRequest | null | undefined | Promise<CheckRequest | null | undefined>;
}

/**
 * A middleware that checks each request before its handler: an allowed check sets
 * RateLimit-* (and Quotaplane-Warning, in warn mode), puts the decision on
 * `req.quotaplane` and calls next(); a denied one is answered by `onDenied` (by
 * default 429 with Retry-After, RateLimit-* and a problem+json body), and the handler
 * never runs. When the fail policy refused the request (Quotaplane unreachable), the
 * default answers 503. An error of the check itself (a user that is not registered
 * and no team named, a bad key, an unknown metric, a misconfigured client; Quotaplane
 * unreachable when the client has no fail policy) is answered as `onError` says: by
 * default logged and a problem+json (answerError), never the router's error page. When
 * the client goes away during the check, the check is aborted and nothing is answered.
 */
export function checkMiddleware<Req = IncomingMessage, Res extends ResponseLike = ServerResponse>(
  client: Pick<Quotaplane, "check">,
  opts: CheckMiddlewareOptions<Req, Res>,
): Middleware<Req, Res> {
  const run = async (req: Req, res: Res, next: Next): Promise<boolean> => {
    if (opts.skip && (await opts.skip(req, res))) return true;
    const input = await opts.check(req);
    if (!input) return true;
    const gone = watchDisconnect(res);
    let out: CheckOutcome;
    try {
      out = await client.check(input, { signal: gone.signal });
    } catch (err) {
      if (err instanceof QuotaplaneAbortError && gone.signal.aborted) return false; // nobody to answer
      throw wrap(err);
    } finally {
      gone.stop();
    }
    return decided({ operation: "check", ...out }, req, res, next, opts);
  };
  return (req, res, next) => {
    run(req, res, next).then((go) => go && next(), (err: unknown) => failed(err, req, res, next, opts));
  };
}

/** How the handler under reserveMiddleware or concurrencyMiddleware ended. */
export type Ending =
  /** The response finished, under 500. */
  | "finished"
  /** The client went away first, and the handler then ended its response (res.end). */
  | "disconnected"
  /** The response finished 5xx (an exception, next(err)). */
  | "failed"
  /** The client went away and the handler did not end its response within abandonAfterMs. */
  | "abandoned";

/** What a handler under reserveMiddleware reports, and how its reservation ended. */
export interface Settled {
  /** The reservation held for the request (absent when the fail policy let it through). */
  reservation?: Reservation;
  /** How the handler ended. */
  ending?: Ending;
  /** The units the handler reported, when it did (their sum; per metric, of a reservation of several). */
  used?: number | Costs;
  /** The reservation after its commit or release. */
  result?: Reservation;
  /** Why the commit or release failed. */
  error?: unknown;
}

/** The options of the middlewares that hold a reservation while the handler runs. */
export interface HoldOptions<Req, Res> extends MiddlewareOptions<Req, Res> {
  /** Maps a request to its reservation; null or undefined lets it through holding nothing. */
  reserve: (req: Req) => ReserveRequest | null | undefined | Promise<ReserveRequest | null | undefined>;
  /** Called once the reservation is committed or released, or that failed (default: a failure is logged). */
  onSettled?: (s: Settled, req: Req) => void;
  /**
   * How long, after the client went away, to wait for the handler to end its response
   * (res.end, which node still lets it call) before settling what it reported so far
   * as a failed handler's, in ms (default 60000).
   */
  abandonAfterMs?: number;
}

/** Options of reserveMiddleware. */
export interface ReserveMiddlewareOptions<Req, Res = ServerResponse> extends HoldOptions<Req, Res> {
  /**
   * What to do when the handler finished without reporting usage (reportUsage):
   * `commit` the whole amount held (the default: work done, cost unknown), or
   * `release` it. A failed handler's unreported reservation is released.
   */
  unreported?: "commit" | "release";
}

const usage = new WeakMap<object, number | Costs>();

/**
 * Tells reserveMiddleware (or concurrencyMiddleware) how many units the request used
 * (LLM tokens, GPU seconds), adding them to what it reported before: a streaming
 * handler reports as it goes. The sum is committed when the handler is done, the rest
 * of the reservation given back. Of a reservation of several metrics (`amounts`), the
 * units per metric (`{ requests: 1, tokens: 1234 }`; a metric left out used 0); one
 * request reports one kind.
 */
export function reportUsage(res: object, used: number | Costs): void {
  const check = (n: unknown, what: string) => {
    if (typeof n !== "number" || !Number.isInteger(n) || n < 0) throw new RangeError(`reportUsage: ${what} must be a whole number >= 0, not ${String(n)}`);
  };
  if (typeof used === "number") check(used, "used");
  else for (const [m, n] of Object.entries(used)) check(n, `used of ${m}`);
  const prev = usage.get(res);
  if (prev === undefined) {
    usage.set(res, typeof used === "number" ? used : { ...used });
  } else if (typeof prev === "number" && typeof used === "number") {
    usage.set(res, prev + used);
  } else if (typeof prev === "object" && typeof used === "object") {
    const sum: Costs = { ...prev };
    for (const [m, n] of Object.entries(used)) sum[m] = (sum[m] ?? 0) + n;
    usage.set(res, sum);
  } else {
    throw new TypeError("reportUsage: a number and units per metric cannot be added: report one kind per request");
  }
}

/** What the handler of `res` reported so far (reportUsage), undefined when nothing. */
export function reportedUsage(res: object): number | Costs | undefined {
  const u = usage.get(res);
  return typeof u === "object" ? { ...u } : u;
}

/** The reservation id of the request of `res` under concurrencyMiddleware (undefined outside it). */
export function reservationId(res: object): string | undefined {
  return slotIds.get(res);
}
const slotIds = new WeakMap<object, string>();

/**
 * A middleware that reserves before the handler and commits after it: the request is
 * refused as checkMiddleware refuses it when the reservation is denied; otherwise the
 * handler runs and reports its cost with reportUsage(res, used), and when the handler
 * is done (the response finished, or, the client gone, the handler ended it) the
 * reservation is committed with what was reported, or settled as `unreported` says.
 * A client that goes away mid-stream pays what its stream reported. A failed handler
 * (5xx) commits what it reported, and releases when it reported nothing.
 */
export function reserveMiddleware<Req = IncomingMessage, Res extends ResponseLike = ServerResponse>(
  client: Pick<Quotaplane, "reserve" | "commit" | "release">,
  opts: ReserveMiddlewareOptions<Req, Res>,
): Middleware<Req, Res> {
  const unreported = opts.unreported ?? "commit";
  const log = opts.logger ?? console;
  const run = async (req: Req, res: Res, next: Next): Promise<boolean> => {
    if (opts.skip && (await opts.skip(req, res))) return true;
    const input = await opts.reserve(req);
    if (!input) return true;
    const out = await client.reserve(input).catch(wrap);
    const reservation = out.reservation;
    if (reservation && gone(res)) {
      // The client went away while the reservation was made: nothing will run.
      client.release(reservation.id).catch((err: unknown) => log.error(`quotaplane: releasing reservation ${reservation.id} of a client gone:`, err));
      return false;
    }
    const go = decided({ operation: "reserve", ...out }, req, res, next, opts);
    if (go && reservation) {
      whenHandlerDone(res, opts.abandonAfterMs ?? DEFAULT_ABANDON_AFTER_MS, (ending) => {
        const whole = reservation.metrics?.length ? amountsOf(reservation) : reservation.amount;
        settle(client, reservation, ending, usage.get(res), unreported === "commit" ? whole : undefined, req, opts.onSettled, log, "settling reservation");
      });
    }
    return go;
  };
  return (req, res, next) => {
    run(req, res, next).then((go) => go && next(), (err: unknown) => failed(err, req, res, next, opts));
  };
}

/** Options of concurrencyMiddleware. */
export interface ConcurrencyMiddlewareOptions<Req, Res = ServerResponse> extends HoldOptions<Req, Res> {
  /**
   * Maps a request to the slot it holds: a reservation, e.g. `{ org, user, metric:
   * "requests", amount: 1 }`, or `amounts` of requests and tokens at once.
   * `ttl_seconds` defaults to 30 and `on_expiry` to `release`. Null or undefined lets
   * the request through holding nothing.
   */
  reserve: (req: Req) => ReserveRequest | null | undefined | Promise<ReserveRequest | null | undefined>;
  /** How often a running request's reservation is extended, in ms (default: a third of its ttl). */
  heartbeatMs?: number;
  /** Called when an extend fails (default: logged); a 409 (the slot was settled or expired) or 404 stops the heartbeat. */
  onExtendError?: (err: unknown, req: Req) => void;
}

/** The ttl of a slot whose reservation sets none, in seconds. */
export const DEFAULT_SLOT_TTL_SECONDS = 30;

/** How long a middleware waits, the client gone, for the handler to end its response (abandonAfterMs). */
export const DEFAULT_ABANDON_AFTER_MS = 60_000;

/**
 * A middleware that holds a slot (a reservation, typically against a `concurrent`
 * limit: API.md "Concurrency limits") for as long as the request is handled. A denied
 * reservation is refused as checkMiddleware refuses a check (429 with Retry-After, or
 * 503 when the fail policy refused). While the handler runs the reservation is
 * extended every heartbeat, so a stream longer than the ttl keeps its slot and a
 * process that dies loses it within a ttl. The slot is given back once, when the
 * handler is done: the response finished (success, or an error the error handler
 * answered: an exception, next(err)), or, the client gone first, the handler ended
 * the response (or did not within abandonAfterMs). Given back means released, unless
 * the handler reported usage (reportUsage): then that is committed, which gives the
 * slot back all the same.
 */
export function concurrencyMiddleware<Req = IncomingMessage, Res extends ResponseLike = ServerResponse>(
  client: Pick<Quotaplane, "reserve" | "commit" | "release" | "extend">,
  opts: ConcurrencyMiddlewareOptions<Req, Res>,
): Middleware<Req, Res> {
  const log = opts.logger ?? console;
  const run = async (req: Req, res: Res, next: Next): Promise<boolean> => {
    if (opts.skip && (await opts.skip(req, res))) return true;
    const input = await opts.reserve(req);
    if (!input) return true;
    const ttl = input.ttl_seconds ?? DEFAULT_SLOT_TTL_SECONDS;
    const out = await client.reserve({ ...input, ttl_seconds: ttl, on_expiry: input.on_expiry ?? "release" }).catch(wrap);
    const reservation = out.reservation;
    if (reservation && gone(res)) {
      client.release(reservation.id).catch((err: unknown) => log.error(`quotaplane: releasing slot ${reservation.id} of a client gone:`, err));
      return false;
    }
    const go = decided({ operation: "reserve", ...out }, req, res, next, opts);
    if (!go || !reservation) return go; // refused, or the fail policy let it through: nothing is held
    slotIds.set(res, reservation.id);
    const every = Math.max(10, Math.round(opts.heartbeatMs ?? Math.max(100, (ttl * 1000) / 3)));
    // Each extend is bounded by the heartbeat, and aborted when the slot is given back.
    const stop = new AbortController();
    let beating = false;
    const timer = setInterval(() => {
      if (beating) return;
      beating = true;
      client
        .extend(reservation.id, ttl, { signal: AbortSignal.any([stop.signal, AbortSignal.timeout(every)]), budgetMs: every })
        .catch((err: unknown) => {
          if (stop.signal.aborted) return;
          if (err instanceof QuotaplaneError && (err.status === 409 || err.status === 404)) clearInterval(timer);
          if (opts.onExtendError) opts.onExtendError(err, req);
          else log.warn(`quotaplane: extending slot ${reservation.id}:`, err);
        })
        .finally(() => (beating = false));
    }, every);
    timer.unref?.();
    whenHandlerDone(res, opts.abandonAfterMs ?? DEFAULT_ABANDON_AFTER_MS, (ending) => {
      clearInterval(timer);
      stop.abort();
      settle(client, reservation, ending, usage.get(res), undefined, req, opts.onSettled, log, "giving back slot");
    });
    return true;
  };
  return (req, res, next) => {
    run(req, res, next).then((go) => go && next(), (err: unknown) => failed(err, req, res, next, opts));
  };
}

// settle commits what the handler reported; else, when it finished (not failed) and
// `whole` is given (reserveMiddleware's unreported "commit"), the whole amount;
// else releases. One rule with the Go middleware: a failed handler commits what it
// reported so far, and releases when it reported nothing.
function settle<Req>(
  client: Pick<Quotaplane, "commit" | "release">,
  reservation: Reservation,
  ending: Ending,
  used: number | Costs | undefined,
  whole: number | Costs | undefined,
  req: Req,
  onSettled: ((s: Settled, req: Req) => void) | undefined,
  log: Logger,
  what: string,
): void {
  const s: Settled = { reservation, ending };
  if (used !== undefined) s.used = used;
  const ok = ending === "finished" || ending === "disconnected";
  const commit = used ?? (ok ? whole : undefined);
  const p = commit !== undefined ? client.commit(reservation.id, commit) : client.release(reservation.id);
  p.then(
    (r) => onSettled?.({ ...s, result: r }, req),
    (error: unknown) => {
      if (onSettled) onSettled({ ...s, error }, req);
      else log.error(`quotaplane: ${what} ${reservation.id}:`, error);
    },
  );
}

// whenHandlerDone calls done once, when the handler is done with the response: at its
// 'finish' (node emits none once the client has gone); or, the client gone first
// ('close' before the response finished), when the handler ends the response, which
// node still lets it do, with no event: end is wrapped to see it. A handler that never
// ends it is given up after abandonAfterMs.
function whenHandlerDone(res: ResponseLike, abandonAfterMs: number, done: (e: Ending) => void): void {
  let over = false;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const finish = (e: Ending) => {
    if (over) return;
    over = true;
    if (timer) clearTimeout(timer);
    done(e);
  };
  res.once("finish", () => finish(res.statusCode >= 500 ? "failed" : "finished"));
  res.once("close", () => {
    if (over || res.writableFinished !== false) return; // finished: 'finish' said it
    if (res.writableEnded) return finish(res.statusCode >= 500 ? "failed" : "disconnected");
    const end = res.end as (...args: unknown[]) => unknown;
    res.end = function (this: unknown, ...args: unknown[]) {
      res.end = end as ResponseLike["end"];
      const r = end.apply(this, args);
      finish(res.statusCode >= 500 ? "failed" : "disconnected");
      return r;
    } as ResponseLike["end"];
    timer = setTimeout(() => finish("abandoned"), abandonAfterMs);
    timer.unref?.();
  });
}

// gone says whether the client went away before the response was written.
function gone(res: ResponseLike): boolean {
  return (res as { destroyed?: boolean }).destroyed === true && res.writableFinished === false;
}

// watchDisconnect aborts its signal if the client goes away before stop is called.
function watchDisconnect(res: ResponseLike): { signal: AbortSignal; stop: () => void } {
  const ac = new AbortController();
  const onClose = () => {
    if (res.writableFinished === false) ac.abort(new Error("the client went away"));
  };
  if (gone(res)) ac.abort(new Error("the client went away"));
  else res.once("close", onClose);
  return { signal: ac.signal, stop: () => res.removeListener?.("close", onClose) };
}

// decided puts the decision on the request and either lets it go on (true: RateLimit-*
// and Quotaplane-Warning set) or hands it to onDenied (false).
function decided<Req, Res extends ResponseLike>(decision: QuotaplaneDecision, req: Req, res: Res, next: Next, opts: MiddlewareOptions<Req, Res>): boolean {
  (req as { quotaplane?: QuotaplaneDecision }).quotaplane = decision;
  if (decision.warning && !res.headersSent) res.setHeader("Quotaplane-Warning", decision.warning);
  if (!decision.allowed) {
    if (opts.onDenied) opts.onDenied(decision, req, res, next);
    else answerDenied(res, decision);
    return false;
  }
  setRateLimit(res, decision.rateLimit, decision.policies);
  return true;
}

/**
 * What the middleware hands to onError (or next(err), with onError "next") when the
 * client threw: a QuotaplaneError (a bad key, an unknown metric: the service's
 * configuration, not its caller's request), a QuotaplaneConfigError or a
 * QuotaplaneUnavailableError as the `cause` of a plain error, so that Express does
 * not answer the caller with Quotaplane's status (its default handler uses err.status).
 */
export class QuotaplaneMiddlewareError extends Error {
  override readonly name = "QuotaplaneMiddlewareError";
  /** The client's error. */
  declare readonly cause: QuotaplaneError | QuotaplaneUnavailableError | QuotaplaneConfigError;
  constructor(cause: QuotaplaneError | QuotaplaneUnavailableError | QuotaplaneConfigError) {
    super(`quotaplane middleware: ${cause.message}`, { cause });
  }
}

// failed handles what run threw: the client's errors as onError says, anything else
// (the app's own check, reserve or skip function threw) to next(err).
function failed<Req, Res extends ResponseLike>(err: unknown, req: Req, res: Res, next: Next, opts: MiddlewareOptions<Req, Res>): void {
  if (!(err instanceof QuotaplaneMiddlewareError)) return next(err);
  const onError = opts.onError;
  if (onError === "next") return next(err);
  if (typeof onError === "function") return onError(err, req, res, next);
  answerError(res, err, opts.logger);
}

/**
 * answerError answers the caller for a client error the middleware met (onError
 * "answer"), with a problem+json and no stack trace, and logs it:
 *
 * - Quotaplane refused what the request named (400, 404, 409, 422: a user that is not
 *   registered and no team, an unknown org, team or metric): 403, with Quotaplane's
 *   detail, since the caller is not one the quota knows (logged as a warning);
 * - Quotaplane refused the service's own key (401, 403), or the client is misconfigured
 *   (QuotaplaneConfigError): 500, without the detail (the caller cannot fix it; the
 *   log says it for the operator);
 * - Quotaplane could not be reached and the client has no fail policy: 503 with
 *   Retry-After, as a fail policy's refusal (logged).
 */
export function answerError(res: ResponseLike, err: QuotaplaneMiddlewareError, logger: Logger = console): void {
  const cause = err.cause;
  let body: Record<string, unknown>;
  if (cause instanceof QuotaplaneError && cause.status !== 401 && cause.status !== 403) {
    logger.warn(`quotaplane middleware: ${cause.message} (answered 403)`);
    if (res.headersSent) return;
    res.statusCode = 403;
    body = {
      type: "https://quotaplane.dev/problems/quota-refused",
      title: "Forbidden",
      status: 403,
      detail: `the quota service refused this request: ${cause.problem.detail ?? cause.problem.title}`,
      quota_status: cause.status,
    };
    if (cause.problem.errors) body.errors = cause.problem.errors;
  } else if (cause instanceof QuotaplaneError || cause instanceof QuotaplaneConfigError) {
    const why = cause instanceof QuotaplaneError ? "the service's API key" : "the client's configuration";
    logger.error(`quotaplane middleware: ${cause.message} (${why})`);
    if (res.headersSent) return;
    res.statusCode = 500;
    body = {
      type: "https://quotaplane.dev/problems/quota-misconfigured",
      title: "Internal Server Error",
      status: 500,
      detail: cause instanceof QuotaplaneError ? "the quota service refused this service's credentials" : "this service cannot reach the quota service as configured",
    };
  } else {
    logger.error(`quotaplane middleware: ${cause.message} (no fail policy: answered 503)`);
    if (res.headersSent) return;
    body = unavailable(res, cause.retryAfterSeconds);
  }
  res.setHeader("Content-Type", "application/problem+json");
  res.setHeader("Cache-Control", "no-store");
  res.end(JSON.stringify(body));
}

function wrap(err: unknown): never {
  if (err instanceof QuotaplaneError || err instanceof QuotaplaneUnavailableError || err instanceof QuotaplaneConfigError) throw new QuotaplaneMiddlewareError(err);
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

/**
 * answerDenied is onDenied's default: it answers a request the check or reservation
 * did not allow, 429 with Retry-After, RateLimit-* and a problem+json (`blocked_at`)
 * when Quotaplane denied it, 503 with Retry-After when the fail policy did (nothing was
 * decided about the quota). A denial naming a level without a Retry-After (a cost
 * above a token bucket's burst can never fit) has none either, and says so. A custom
 * onDenied may call it after its own logging.
 */
export function answerDenied(res: ResponseLike, out: CheckOutcome | ReserveOutcome): void {
  if (res.headersSent) return;
  let body: Record<string, unknown>;
  if (out.decidedBy === "quotaplane") {
    const result = "denied" in out ? out.denied : (out as CheckOutcome).result;
    const b = result?.blocked_at;
    const never = b !== undefined && out.retryAfterSeconds === undefined;
    const retry = out.retryAfterSeconds ?? 1;
    res.statusCode = 429;
    if (!never) res.setHeader("Retry-After", String(retry));
    setRateLimit(res, out.rateLimit, out.policies);
    body = {
      type: "https://quotaplane.dev/problems/too-many-requests",
      title: "Too Many Requests",
      status: 429,
      detail: never
        ? `over quota at ${b.level} "${b.id}" (${b.window}); the cost can never fit`
        : b
          ? `over quota at ${b.level} "${b.id}" (${b.window}); retry after ${retry} s`
          : `over quota; retry after ${retry} s`,
    };
    if (!never) body.retry_after_seconds = retry;
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
