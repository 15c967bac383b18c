// Coalescing (API.md "Check", batch): checks that arrive within batchWaitMs of the
// first one waiting go out together, as one POST /v1/check/batch of at most 100 (the
// API's bound); a full batch goes at once. At most two batches are in flight: the api
// decides at most 256 checks of one org at once (QUOTA_MAX_INFLIGHT_PER_ORG) and
// answers the rest 503, so what arrives meanwhile waits and goes out as the next
// batch. Each caller is answered on its own.
import { QuotaplaneAbortError } from "./errors.js";

/** The most checks one POST /v1/check/batch takes (API.md "Check"). */
export const maxBatch = 100;
const maxInFlight = 2;

/** One caller's check waiting to go out. */
export interface Waiting<Req, Out> {
  readonly request: Req;
  /** performance.now() when the caller's budget ends. */
  readonly deadline: number;
  readonly signal: AbortSignal | undefined;
  /** Answers the caller (once: later answers are ignored). */
  resolve(out: Out): void;
  reject(err: unknown): void;
  /** Whether the caller was answered (or gave up). */
  readonly done: boolean;
  /** Requests sent for it so far. */
  attempts: number;
}

/** Queues checks and hands them to `send` in groups of at most maxBatch. */
export class Coalescer<Req, Out> {
  readonly #waitMs: number;
  readonly #send: (items: Waiting<Req, Out>[]) => Promise<void>;
  #queue: Waiting<Req, Out>[] = [];
  #timer: ReturnType<typeof setTimeout> | undefined;
  #inflight = 0;

  constructor(waitMs: number, send: (items: Waiting<Req, Out>[]) => Promise<void>) {
    this.#waitMs = Math.max(0, waitMs);
    this.#send = send;
  }

  /** Queues a check; resolves with its own outcome, rejects with its own error. */
  add(request: Req, budgetMs: number, signal: AbortSignal | undefined): Promise<Out> {
    if (signal?.aborted) return Promise.reject(new QuotaplaneAbortError(signal.reason));
    return new Promise<Out>((resolve, reject) => {
      let done = false;
      const onAbort = () => finish(() => reject(new QuotaplaneAbortError(signal?.reason)));
      const finish = (f: () => void) => {
        if (done) return;
        done = true;
        signal?.removeEventListener("abort", onAbort);
        f();
      };
      const item: Waiting<Req, Out> = {
        request,
        deadline: performance.now() + budgetMs,
        signal,
        resolve: (out) => finish(() => resolve(out)),
        reject: (err) => finish(() => reject(err)),
        get done() {
          return done;
        },
        attempts: 0,
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      this.#enqueue(item);
    });
  }

  /** Queues a check again (a retry of one the api answered 5xx), after delayMs. */
  requeue(item: Waiting<Req, Out>, delayMs: number): void {
    setTimeout(() => {
      if (!item.done) this.#enqueue(item);
    }, delayMs);
  }

  #enqueue(item: Waiting<Req, Out>): void {
    this.#queue.push(item);
    if (this.#queue.length >= maxBatch) this.flush();
    else if (this.#timer === undefined) this.#timer = setTimeout(() => this.flush(), this.#waitMs);
  }

  /**
   * Sends what is queued now, up to the batches in flight allowed (callers that gave
   * up already are left out); what is left goes when a batch in flight comes back.
   * `all` sends everything at once (close).
   */
  flush(all = false): void {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#queue = this.#queue.filter((w) => !w.done);
    while (this.#queue.length > 0 && (all || this.#inflight < maxInFlight)) {
      const items = this.#queue.splice(0, maxBatch);
      for (const w of items) w.attempts++;
      this.#inflight++;
      void this.#send(items).finally(() => {
        this.#inflight--;
        if (this.#queue.length > 0 && this.#timer === undefined) this.flush();
      });
    }
  }
}
