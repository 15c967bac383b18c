import { describe, expect, it } from 'vitest';
import { render } from 'preact';
import { act } from 'preact/test-utils';
import { ThrottleBanner, throttledLimit } from './throttle';
import { UsageBar } from './ui';
import type { Throttle } from './api';

function mount(ui: preact.ComponentChild) {
  const root = document.createElement('div');
  document.body.appendChild(root);
  act(() => render(ui, root));
  return root;
}

const t: Throttle = { scope: 'org', factor: 0.5, month: false, reason: 'our error rate is above 5%', expires_at: '2026-11-25T12:30:00Z', created_at: '2026-11-25T12:00:00Z', created_by: 'key:k1' };

describe('ThrottleBanner', () => {
  it('says the factor, the reason and the expiry', () => {
    const root = mount(<ThrottleBanner throttle={t} now={new Date('2026-11-25T12:10:00Z')} />);
    expect(root.textContent).toBe('Throttled by your org: every per-second to per-day limit is at 50% (factor 0.5) until 2026-11-25 12:30 UTC. Reason: our error rate is above 5%');
  });

  it('names the plan throttle and the month limit', () => {
    const root = mount(<ThrottleBanner throttle={{ ...t, scope: 'plan', factor: 0.25, month: true }} now={new Date('2026-11-25T12:10:00Z')} />);
    expect(root.textContent).toContain("Throttled by the operator, for your plan: every limit, month included, is at 25% (factor 0.25)");
  });

  it('shows nothing once expired', () => {
    const root = mount(<ThrottleBanner throttle={t} now={new Date('2026-11-25T12:30:00Z')} />);
    expect(root.querySelector('[data-testid="throttle"]')).toBeNull();
  });
});

describe('throttledLimit', () => {
  const now = new Date('2026-11-25T12:10:00Z');
  it('is the limit checks apply: floor(limit * factor), the month only with month set', () => {
    expect(throttledLimit(t, 'minute', 600, now)).toBe(300);
    expect(throttledLimit({ ...t, factor: 0.333333 }, 'second', 10, now)).toBe(3);
    expect(throttledLimit(t, 'month', 100000, now)).toBe(100000);
    expect(throttledLimit({ ...t, month: true }, 'month', 100000, now)).toBe(50000);
    expect(throttledLimit({ ...t, factor: 0.5 }, 'day', 2 ** 50 + 1, now)).toBe(2 ** 49); // exact, no float rounding
  });
  it('is the limit itself without a throttle in force', () => {
    expect(throttledLimit(null, 'minute', 600, now)).toBe(600);
    expect(throttledLimit(t, 'minute', 600, new Date('2026-11-25T12:30:00Z'))).toBe(600);
  });
  it('makes the usage bar say the throttled limit, and what it was', () => {
    const root = mount(<UsageBar label="per minute" used={30} limit={throttledLimit(t, 'minute', 600, now)} unthrottled={600} />);
    expect(root.textContent).toBe('per minute30 of 300 (10%) throttled from 600');
    expect(root.querySelector('[role="progressbar"]')!.getAttribute('aria-valuemax')).toBe('300');
    const plain = mount(<UsageBar label="per month" used={30} limit={100000} unthrottled={100000} />);
    expect(plain.textContent).not.toContain('throttled');
  });
});
