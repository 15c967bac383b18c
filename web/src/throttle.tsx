// The banner of an active throttle (PUT /v1/orgs/{org}/throttle or the plan's).
import type { Throttle } from './api';
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
