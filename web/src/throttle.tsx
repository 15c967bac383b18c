// The banner of an active throttle (PUT /v1/orgs/{org}/throttle or the plan's).
import type { Throttle, Window } from './api';
import { formatTime } from './format';

/** throttleText says what the throttle does, in the console's words. */
export function throttleText(t: Throttle): string {
  const pct = `${Math.round(t.factor * 10000) / 100}%`;
  const whose = t.scope === 'plan' ? 'the operator, for your plan' : 'your org';
  const which = t.month ? 'every limit, month included,' : 'every per-second to per-day limit';
  return `Throttled by ${whose}: ${which} is at ${pct} (factor ${t.factor}) until ${formatTime(t.expires_at)}. Reason: ${t.reason}`;
}

/** ThrottleBanner shows an active throttle; nothing when there is none or it has expired. */
export function ThrottleBanner({ throttle, now }: { throttle: Throttle | null; now: Date }) {
  if (!throttle || new Date(throttle.expires_at) <= now) return null;
  return <div class="notice throttle" role="status" data-testid="throttle">{throttleText(throttle)}</div>;
}

/**
 * throttledLimit is the limit a check applies under the throttle in force at now, as
 * the server's Throttle.Apply computes it: floor(limit * factor) for every window but
 * the month, which only a throttle with month set cuts. Without a throttle in force,
 * limit unchanged.
 */
export function throttledLimit(t: Throttle | null | undefined, window: Window, limit: number, now: Date): number {
  if (!t || new Date(t.expires_at) <= now || limit <= 0 || (window === 'month' && !t.month)) return limit;
  const ppm = Math.round(t.factor * 1e6); // the factor is kept to 6 decimal places
  if (ppm <= 0 || ppm >= 1e6) return limit;
  return Number((BigInt(limit) * BigInt(ppm)) / 1000000n); // exact for any limit up to 2^50
}
