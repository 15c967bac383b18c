// Money (issue 25): spend in micro-units shown as an amount of its currency, by integer
// arithmetic; and the views that show usage, allocations and forecasts of it.
import { describe, expect, it } from 'vitest';
import { render } from 'preact';
import { act } from 'preact/test-utils';
import { currencies, currencyOf, formatAmount, formatMicros, formatUsedOf } from './format';
import { MiniBar, UsageBar } from './ui';
import { AllocationTable } from './pages/Allocation';
import type { AllocRow } from './allocation';

function mount(ui: preact.ComponentChild) {
  const root = document.createElement('div');
  document.body.appendChild(root);
  act(() => render(ui, root));
  return root;
}

describe('formatMicros', () => {
  it('writes micro-units as an amount with two decimals and separators', () => {
    expect(formatMicros(1_234_560_000)).toBe('1,234.56');
    expect(formatMicros(2_000_000_000)).toBe('2,000.00');
    expect(formatMicros(0)).toBe('0.00');
    expect(formatMicros(1)).toBe('0.00');
    expect(formatMicros(10_000)).toBe('0.01');
    expect(formatMicros(999_999_999_999)).toBe('1,000,000.00');
  });
  it('rounds half up to the cent, by integer arithmetic (no float error)', () => {
    expect(formatMicros(4_999)).toBe('0.00');
    expect(formatMicros(5_000)).toBe('0.01');
    expect(formatMicros(1_234_565_000)).toBe('1,234.57');
    // 0.1 + 0.2 as floats is 0.30000000000000004: as micro-units it is exact.
    expect(formatMicros(100_000 + 200_000)).toBe('0.30');
    expect(formatMicros(1_005_000)).toBe('1.01'); // (1.005).toFixed(2) is "1.00"
  });
  it('keeps exact the largest amounts a counter holds, and negatives', () => {
    expect(formatMicros(9_007_199_254_740_991)).toBe('9,007,199,254.74');
    expect(formatMicros(2n ** 62n)).toBe('4,611,686,018,427.39');
    expect(formatMicros(-1_234_560_000)).toBe('-1,234.56');
    expect(formatMicros(-4_000)).toBe('0.00');
  });
});

describe('money in usage', () => {
  it('is money only where usage names a currency', () => {
    expect(currencyOf({ metric: 'spend', currency: 'USD' } as never)).toBe('USD');
    expect(currencyOf({ metric: 'requests' })).toBeUndefined();
    expect(currencies({ metrics: [{ metric: 'requests' }, { metric: 'spend', currency: 'EUR' } as never] })).toEqual({ spend: 'EUR' });
    expect(currencies(undefined)).toEqual({});
  });
  it('writes "used of limit" as money, or units', () => {
    expect(formatUsedOf(1_234_560_000, 2_000_000_000, 'USD')).toBe('1,234.56 USD of 2,000.00');
    expect(formatUsedOf(1234, 2000)).toBe('1,234 of 2,000');
    expect(formatAmount(500_000_000, 'USD')).toBe('500.00 USD');
  });
  it('UsageBar and MiniBar show spend as money', () => {
    const bar = mount(<UsageBar label="per month" used={1_234_560_000} limit={2_000_000_000} currency="USD" />);
    expect(bar.textContent).toContain('1,234.56 USD of 2,000.00 (61%)');
    expect(bar.querySelector('[role=progressbar]')!.getAttribute('aria-valuetext')).toBe('1,234.56 USD of 2,000.00');
    const units = mount(<UsageBar label="per month" used={1234} limit={2000} />);
    expect(units.textContent).toContain('1,234 of 2,000');
    const mini = mount(<MiniBar label="eng spend" used={60_000_000} reserved={15_500_000} limit={100_000_000} currency="USD" />);
    expect(mini.textContent).toContain('60.00 USD used + 15.50 USD reserved of 100.00');
  });
  it('the allocation table shows spend rows and their forecast as money, other metrics as units', () => {
    const base = { kind: 'team' as const, id: 'research', registered: true, window: 'month' as const, reserved: 0, inherited: false, ratio: 0.5 };
    const rows: AllocRow[] = [
      { ...base, metric: 'spend', limit: 2_000_000_000, used: 1_000_000_000, forecast: { kind: 'lasts', projected: 1_800_000_000 } as never },
      { ...base, metric: 'tokens', limit: 2000, used: 1000 },
    ];
    const root = mount(<AllocationTable rows={rows} money={{ spend: 'USD' }} />);
    const spend = root.querySelector('[data-testid="alloc-row-team-research-spend-month"]')!.textContent!;
    expect(spend).toContain('1,000.00 USD of 2,000.00');
    expect(spend).toContain('about 1,800.00 USD by its end');
    expect(root.querySelector('[data-testid="alloc-row-team-research-tokens-month"]')!.textContent).toContain('1,000 of 2,000');
  });
});
