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
