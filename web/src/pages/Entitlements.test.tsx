import { afterEach, describe, expect, it, vi } from 'vitest';
import { render } from 'preact';
import { act } from 'preact/test-utils';
import { Entitlements, featureRows, featureText } from './Entitlements';
import type { OrgFeatures, Session } from '../api';

const features: OrgFeatures = {
  org: 'acme', plan: 'pro',
  plan_features: { sso: true, seats: 25, tier: 'gold', beta: true },
  overrides: { seats: 50, beta: null, region: 'eu' },
  features: { sso: true, seats: 50, tier: 'gold', region: 'eu' },
  sources: { sso: 'plan', seats: 'org', tier: 'plan', region: 'org' },
};

describe('entitlements', () => {
  afterEach(() => vi.unstubAllGlobals());

  it('featureText writes booleans, integers and strings', () => {
    expect([true, false, 1234567, 'gold', null, undefined].map(featureText)).toEqual(['yes', 'no', '1,234,567', 'gold', 'removed', '—']);
  });

  it('featureRows lists resolved features by name, then the ones removed for the org', () => {
    expect(featureRows(features).map((r) => [r.name, r.value, r.overridden])).toEqual([
      ['region', 'eu', true], ['seats', 50, true], ['sso', true, false], ['tier', 'gold', false], ['beta', undefined, true],
    ]);
  });

  it('shows the resolved features read-only, with where each comes from', async () => {
    const fetch = vi.fn(async () => new Response(JSON.stringify(features), { status: 200, headers: { 'Content-Type': 'application/json' } }));
    vi.stubGlobal('fetch', fetch);
    const root = document.createElement('div');
    document.body.appendChild(root);
    const session: Session = { user_id: 'u1', email: 'a@acme.test', org: 'acme', role: 'admin', csrf_token: 't', expires_at: '' };
    await act(async () => { render(<Entitlements session={session} />, root); });
    await act(async () => { await new Promise((r) => setTimeout(r, 0)); });
    expect(fetch).toHaveBeenCalledWith('/v1/orgs/acme/features', expect.objectContaining({ method: 'GET' }));
    expect(root.querySelector('[data-testid="features-plan"]')!.textContent).toBe('pro');
    expect(root.querySelector('[data-testid="feature-value-seats"]')!.textContent).toBe('50');
    expect(root.querySelector('[data-testid="feature-source-seats"]')!.textContent).toBe('org override');
    expect(root.querySelector('[data-testid="feature-value-sso"]')!.textContent).toBe('yes');
    expect(root.querySelector('[data-testid="feature-source-sso"]')!.textContent).toBe('plan');
    expect(root.querySelector('[data-testid="feature-value-beta"]')!.textContent).toBe('removed for this org');
    expect(root.querySelector('[data-testid="feature-beta"]')!.textContent).toContain('yes'); // the plan's value
    expect(root.querySelectorAll('input, form').length).toBe(0); // read-only
  });
});
