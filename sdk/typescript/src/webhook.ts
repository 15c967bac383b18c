import { createHmac, timingSafeEqual } from "node:crypto";

/** The headers of a webhook delivery. */
export const SIGNATURE_HEADER = "Quotaplane-Signature"; // t=<unix>,v1=<hex>
export const EVENT_HEADER = "Quotaplane-Event"; // the event type, as in the body
export const DELIVERY_HEADER = "Quotaplane-Delivery"; // the event id: the same on every retry of one event

/**
 * How far a signature's timestamp may be from now, in seconds: deliveries are signed
 * when sent, so an older one is a replay (or a clock far off).
 */
export const DEFAULT_TOLERANCE_SECONDS = 300;

/** Why verifyWebhook refused a delivery. */
export type WebhookFailure = "malformed" | "timestamp" | "mismatch";

const messages: Record<WebhookFailure, string> = {
  malformed: "malformed signature header",
  timestamp: "signature timestamp out of tolerance",
  mismatch: "signature mismatch",
};

/** A delivery whose signature does not hold; `reason` says why. */
export class WebhookVerificationError extends Error {
  override readonly name = "WebhookVerificationError";
  readonly reason: WebhookFailure;
  constructor(reason: WebhookFailure) {
    super(messages[reason]);
    this.reason = reason;
  }
}

/** Options of verifyWebhook. */
export interface VerifyOptions {
  /** Now, for tests (default: the clock). */
  now?: Date;
  /** How far the timestamp may be from now, in seconds (default 300). */
  toleranceSeconds?: number;
}

const INT64_MAX = 2n ** 63n - 1n;

function mac(secret: string, ts: string, body: string | Uint8Array): string {
  return createHmac("sha256", secret).update(ts).update(".").update(body).digest("hex");
}

/**
 * The Quotaplane-Signature value of body sent at `at`, keyed with secret: what the
 * worker sends (webhook.Sign in Go). For testing a receiver.
 */
export function signWebhook(secret: string, body: string | Uint8Array, at: Date = new Date()): string {
  const ts = String(Math.floor(at.getTime() / 1000));
  return `t=${ts},v1=${mac(secret, ts, body)}`;
}

/**
 * Checks header, the Quotaplane-Signature of a delivery, against body and the org's
 * signing secret (GET /v1/orgs/{org}/webhook), as Go's webhook.Verify does: it
 * returns when one of the header's v1 signatures is secret's (for a day after the org
 * rotates its secret a delivery carries two, the new secret's and the previous one's)
 * and its timestamp within the tolerance of now, and throws WebhookVerificationError
 * otherwise. body must be the raw bytes as received (a Buffer from express.raw(), say),
 * before any JSON parsing: a string is taken as its UTF-8 bytes.
 */
export function verifyWebhook(secret: string, header: string | null | undefined, body: string | Uint8Array, opts: VerifyOptions = {}): void {
  let ts = "";
  const sigs: string[] = [];
  for (const part of (header ?? "").split(",")) {
    const i = part.indexOf("=");
    const k = i < 0 ? part : part.slice(0, i);
    const v = i < 0 ? "" : part.slice(i + 1);
    if (k === "t") ts = v;
    else if (k === "v1" && v !== "") sigs.push(v);
  }
  // The timestamp as Go's strconv.ParseInt reads it: an optional sign and digits, an int64.
  if (!/^[+-]?\d+$/.test(ts) || sigs.length === 0) throw new WebhookVerificationError("malformed");
  const sec = BigInt(ts);
  if (sec > INT64_MAX || sec < -INT64_MAX - 1n) throw new WebhookVerificationError("malformed");
  const toleranceMs = BigInt(Math.round((opts.toleranceSeconds ?? DEFAULT_TOLERANCE_SECONDS) * 1000));
  const d = BigInt((opts.now ?? new Date()).getTime()) - sec * 1000n;
  if (d > toleranceMs || d < -toleranceMs) throw new WebhookVerificationError("timestamp");
  // Signed as Sign writes the timestamp: "t=012" is not the "t=12" that was signed.
  const want = Buffer.from(mac(secret, sec.toString(), body));
  let ok = false;
  for (const sig of sigs) {
    // Every signature is compared (constant time each), not only up to a match.
    const got = Buffer.from(sig);
    if (want.length === got.length && timingSafeEqual(want, got)) ok = true;
  }
  if (!ok || sec.toString() !== ts) throw new WebhookVerificationError("mismatch");
}
