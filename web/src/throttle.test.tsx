import { describe, expect, it } from 'vitest';
import { render } from 'preact';
import { act } from 'preact/test-utils';
import { ThrottleBanner } from './throttle';
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
