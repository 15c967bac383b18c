import type { components } from "./schema.js";

/** An RFC 9457 problem document, as Quotaplane answers every error. */
export type Problem = components["schemas"]["Problem"];

/**
 * Quotaplane answered and refused the call: bad input (400), a bad key (401), a key
 * without the scope (403), not found (404), a state conflict (409), a metric the org
 * does not know or an idempotency key reused with another request (422), and any
 * other 4xx answer that is not a decision (a 429 of a check is one). `problem` is the
 * document Quotaplane sent (or one made from the status when the body was not one).
 */
export class QuotaplaneError extends Error {
  override readonly name = "QuotaplaneError";
  /** The HTTP status. */
  readonly status: number;
  /** The problem document of the answer. */
  readonly problem: Problem;

  constructor(status: number, problem: Problem) {
    super(`quotaplane: ${status} ${problem.title}${problem.detail ? `: ${problem.detail}` : ""}`);
    this.status = status;
    this.problem = problem;
  }
}

/**
 * Quotaplane could not decide: it was unreachable, did not answer within the
 * timeout, or answered 5xx, on every attempt. Checks and reservations hand it to the
 * client's fail policy, or throw it when the client has none; commit, release and
 * get throw it.
 */
export class QuotaplaneUnavailableError extends Error {
  override readonly name = "QuotaplaneUnavailableError";
  /** How many requests were sent. */
  readonly attempts: number;
  /** The status of the last answer, when the last attempt got one (5xx). */
  readonly status: number | undefined;
  /** The problem document of the last answer, when it had one. */
  readonly problem: Problem | undefined;
  /** Retry-After of the last answer, in seconds, when it had one. */
  readonly retryAfterSeconds: number | undefined;

  constructor(
    message: string,
    opts: { attempts: number; cause?: unknown; status?: number; problem?: Problem; retryAfterSeconds?: number },
  ) {
    super(message, { cause: opts.cause });
    this.attempts = opts.attempts;
    this.status = opts.status;
    this.problem = opts.problem;
    this.retryAfterSeconds = opts.retryAfterSeconds;
  }
}

/**
 * The client cannot reach Quotaplane as configured, and retrying will not change that:
 * a base URL fetch refuses (an unknown scheme, a bad port, not a URL), a host name that
 * does not resolve (ENOTFOUND), a TLS failure (a certificate not trusted, https to a
 * plain http port). It is thrown at once: never retried, never handed to the fail
 * policy, so that a misconfigured service does not fail open silently. `cause` is
 * fetch's error.
 */
export class QuotaplaneConfigError extends Error {
  override readonly name = "QuotaplaneConfigError";
  constructor(message: string, opts: { cause?: unknown } = {}) {
    super(message, { cause: opts.cause });
  }
}

/**
 * The caller gave up: the call's `signal` aborted (a deadline of the caller's, a client
 * that went away). Thrown as is, never handed to the fail policy: nothing was decided,
 * and nobody waits for an answer. Its `name` is "AbortError", as fetch's own, and
 * `cause` is the signal's reason. (The client's own budget running out is not this: that
 * is Quotaplane being unavailable, answered by the fail policy.)
 */
export class QuotaplaneAbortError extends Error {
  override readonly name = "AbortError";
  constructor(reason: unknown) {
    super(`quotaplane: the call was aborted by its caller${reason instanceof Error ? `: ${reason.message}` : ""}`, { cause: reason });
  }
}
