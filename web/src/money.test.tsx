// Money: spend in micro-units shown as an amount of its currency, by integer maths;
// the views that show usage, allocations and forecasts of it; and the limits editor,
// which shows and takes a spend limit as an amount and sends micro-units.
import { describe, expect, it, vi } from 'vitest';
import { render } from 'preact';
import { act } from 'preact/test-utils';
import { currencies, currencyOf, formatAmount, formatMicros, formatMicrosExact, formatUsedOf, parseLimitIn, parseMoney } from './format';
import { LimitsEditor } from './limits';
import { MiniBar, UsageBar } from './ui';
import { AllocationTable, NewTeam } from './pages/Allocation';
import { api } from './api';
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

describe('spend limits are edited as money', () => {
  it('formatMicrosExact writes a limit exactly: two decimals, more only where needed', () => {
    expect(formatMicrosExact(200_000_000)).toBe('200.00');
    expect(formatMicrosExact(1_234_567)).toBe('1.234567');
    expect(formatMicrosExact(1_500_000)).toBe('1.50');
    expect(formatMicrosExact(1_234_500_000_000)).toBe('1,234,500.00');
    expect(formatMicrosExact(1_234_500_000_000, true)).toBe('1234500.00');
    expect(formatMicrosExact(0)).toBe('0.00');
    expect(formatMicrosExact(1)).toBe('0.000001');
    expect(formatMicrosExact(Number.MAX_SAFE_INTEGER)).toBe('9,007,199,254.740991');
  });
  it('parseMoney reads an amount into micro-units by integer arithmetic', () => {
    expect(parseMoney('500', 'USD')).toEqual({ value: 500_000_000 });
    expect(parseMoney(' 12.50 ', 'USD')).toEqual({ value: 12_500_000 });
    expect(parseMoney('1,000.25', 'USD')).toEqual({ value: 1_000_250_000 });
    expect(parseMoney('1 000 000', 'USD')).toEqual({ value: 1_000_000_000_000 });
    expect(parseMoney('0.000001', 'USD')).toEqual({ value: 1 });
    expect(parseMoney('.5', 'USD')).toEqual({ value: 500_000 });
    expect(parseMoney('500 USD', 'USD')).toEqual({ value: 500_000_000 });
    expect(parseMoney('500usd', 'USD')).toEqual({ value: 500_000_000 });
    expect(parseMoney('0', 'USD')).toEqual({ value: 0 });
    // 0.29 * 1e6 is 290000.00000000006 as floats: read as strings it is exact.
    expect(parseMoney('0.29', 'USD')).toEqual({ value: 290_000 });
    expect(parseMoney('1.005', 'USD')).toEqual({ value: 1_005_000 });
    expect(parseMoney('9007199254.740991', 'USD')).toEqual({ value: Number.MAX_SAFE_INTEGER });
  });
  it('parseMoney refuses what it cannot read exactly', () => {
    expect(parseMoney('', 'USD').error).toBe('Enter an amount of USD.');
    expect(parseMoney('USD', 'USD').error).toBe('Enter an amount of USD.');
    for (const bad of ['-5', 'abc', '1.000,50', '1,00', '12,3456', '.', '1e6', '5 EUR', '1.2.3']) {
      expect(parseMoney(bad, 'USD').error, bad).toBe('An amount is USD of 0 or more, like 500 or 12.50.');
    }
    expect(parseMoney('1.2345678', 'USD').error).toMatch(/at most 6 decimals/);
    expect(parseMoney('9007199254.740992', 'USD').error).toBe('That amount is too large.');
    expect(parseLimitIn('1.5', 'USD')).toEqual({ value: 1_500_000 });
    expect(parseLimitIn('1.5k')).toEqual({ value: 1500 });
  });

  const limits = [{ metric: 'spend', window: 'month' as const, limit: 200_000_000 }, { metric: 'requests', window: 'month' as const, limit: 1000 }];
  const submit = async (root: HTMLElement) => {
    await act(async () => { root.querySelector('form')!.dispatchEvent(new Event('submit', { bubbles: true, cancelable: true })); });
  };
  const type = (input: HTMLInputElement, v: string) => act(() => { input.value = v; input.dispatchEvent(new Event('input', { bubbles: true })); });

  it('shows spend limits, own and inherited, in the currency and others in units', () => {
    const root = mount(<LimitsEditor label="User ada" idPrefix="m1" list="limits" limits={limits} canEdit={false} onSave={vi.fn()} money={{ spend: 'USD' }}
      defaults={{ limits: [{ metric: 'spend', window: 'day', limit: 12_345_678 }], from: 'the user defaults of research' }} />);
    const cells = [...root.querySelectorAll('tbody tr')].map((tr) => tr.textContent);
    expect(cells).toEqual(['requestsmonth1,000', 'spendmonth200.00 USD', 'spendday12.345678 USD']);
  });
  it('without a currency (usage not loaded) a spend limit stays in micro-units', () => {
    const root = mount(<LimitsEditor label="Team r" idPrefix="m2" list="limits" limits={limits} canEdit={false} onSave={vi.fn()} />);
    expect(root.textContent).toContain('200,000,000');
  });
  it('edits a spend limit as an amount and sends micro-units', async () => {
    const onSave = vi.fn().mockResolvedValue(undefined);
    const root = mount(<LimitsEditor label="Team research" idPrefix="m3" list="limits" limits={limits} canEdit onSave={onSave} money={{ spend: 'USD' }} />);
    const edit = root.querySelector('button[aria-label="Edit spend per month limit of Team research"]') as HTMLButtonElement;
    expect(edit.textContent).toBe('200.00 USD');
    act(() => edit.click());
    const input = root.querySelector('input[name="limit"]') as HTMLInputElement;
    expect(input.value).toBe('200.00');
    expect(input.getAttribute('inputmode')).toBe('decimal');
    expect(root.querySelector(`label[for="${input.id}"]`)!.textContent).toBe('spend per month limit in USD');
    expect(root.querySelector('form .unit')!.textContent).toBe('USD');
    type(input, '150.50');
    await submit(root);
    expect(onSave).toHaveBeenCalledWith([{ metric: 'spend', window: 'month', limit: 150_500_000 }, limits[1]]);
  });
  it('refuses an amount finer than a micro-unit without calling the API', async () => {
    const onSave = vi.fn();
    const root = mount(<LimitsEditor label="Team research" idPrefix="m4" list="limits" limits={limits} canEdit onSave={onSave} money={{ spend: 'USD' }} />);
    act(() => (root.querySelector('button[aria-label="Edit spend per month limit of Team research"]') as HTMLButtonElement).click());
    type(root.querySelector('input[name="limit"]') as HTMLInputElement, '1.0000001');
    await submit(root);
    expect(onSave).not.toHaveBeenCalled();
    expect(root.querySelector('.field-error')!.textContent).toBe('An amount has at most 6 decimals (a micro-unit of USD).');
  });
  it('adds a spend limit as an amount, and a requests limit as units', async () => {
    const onSave = vi.fn().mockResolvedValue(undefined);
    const root = mount(<LimitsEditor label="Team ml" idPrefix="m5" list="limits" limits={[]} canEdit onSave={onSave} money={{ spend: 'USD' }} />);
    act(() => (root.querySelector('button.link') as HTMLButtonElement).click());
    const metric = root.querySelector('input[name="metric"]') as HTMLInputElement;
    const input = root.querySelector('input[name="limit"]') as HTMLInputElement;
    expect(root.querySelector('.add-limit .unit')).toBeNull(); // requests: units
    type(metric, 'spend');
    expect(root.querySelector('.add-limit .unit')!.textContent).toBe('USD');
    expect(input.placeholder).toBe('e.g. 500.00');
    type(input, '2,500.75 USD');
    await submit(root);
    expect(onSave).toHaveBeenLastCalledWith([{ metric: 'spend', window: 'month', limit: 2_500_750_000 }]);
  });
  it('adds a requests limit in units beside money', async () => {
    const onSave = vi.fn().mockResolvedValue(undefined);
    const root = mount(<LimitsEditor label="Team ml" idPrefix="m6" list="limits" limits={[]} canEdit onSave={onSave} money={{ spend: 'USD' }} />);
    act(() => (root.querySelector('button.link') as HTMLButtonElement).click());
    type(root.querySelector('input[name="limit"]') as HTMLInputElement, '60k');
    await submit(root);
    expect(onSave).toHaveBeenLastCalledWith([{ metric: 'requests', window: 'month', limit: 60_000 }]);
  });
  it('an open field keeps its unit when usage (and so the currency) arrives while it is open', async () => {
    const onSave = vi.fn().mockResolvedValue(undefined);
    const root = document.createElement('div');
    document.body.appendChild(root);
    const ui = (money?: Record<string, string>) => <LimitsEditor label="Team research" idPrefix="m7" list="limits" limits={limits} canEdit onSave={onSave} money={money} />;
    act(() => render(ui(), root));
    act(() => (root.querySelector('button[aria-label="Edit spend per month limit of Team research"]') as HTMLButtonElement).click());
    const input = root.querySelector('input[name="limit"]') as HTMLInputElement;
    expect(input.value).toBe('200000000');
    act(() => render(ui({ spend: 'USD' }), root)); // usage loaded
    expect(root.querySelector('form .unit')).toBeNull();
    type(input, '150000000');
    await submit(root);
    expect(onSave).toHaveBeenCalledWith([{ metric: 'spend', window: 'month', limit: 150_000_000 }, limits[1]]); // micro-units, not 150 million USD
  });
});

describe('the new-team form takes a spend limit as money', () => {
  const submit = async (root: HTMLElement) => {
    await act(async () => { root.querySelector('form')!.dispatchEvent(new Event('submit', { bubbles: true, cancelable: true })); });
  };
  const type = (root: HTMLElement, name: string, v: string) => act(() => {
    const input = root.querySelector(`input[name="${name}"]`) as HTMLInputElement;
    input.value = v;
    input.dispatchEvent(new Event('input', { bubbles: true }));
  });
  const label = (root: HTMLElement, id: string) => root.querySelector(`label[for="${id}"]`)!.textContent;
  const fill = (root: HTMLElement, metric: string, month: string, perUser: string) => {
    type(root, 'id', 'ml');
    type(root, 'name', 'Machine learning');
    type(root, 'metric', metric);
    type(root, 'limits[0].limit', month);
    type(root, 'user_limits[0].limit', perUser);
  };
  // sent is the team fill creates, its month limits in the unit the API takes.
  const sent = (metric: string, month: number, perUser: number) => ({
    id: 'ml', name: 'Machine learning',
    limits: [{ metric, window: 'month', limit: month }],
    user_limits: [{ metric, window: 'month', limit: perUser }],
  });

  it('sends the amounts of a money metric as micro-units, exactly', async () => {
    const create = vi.spyOn(api, 'createTeam').mockResolvedValue({} as never);
    const onDone = vi.fn();
    const root = mount(<NewTeam org="acme" money={{ spend: 'USD' }} onDone={onDone} />);
    expect(label(root, 'new-team-limits[0].limit')).toBe('Month limit of the team');
    fill(root, ' spend ', '2,500.75 USD', '0.000001');
    expect(label(root, 'new-team-limits[0].limit')).toBe('Month limit of the team (USD)');
    expect(label(root, 'new-team-user_limits[0].limit')).toBe('Month default per user (USD)');
    await submit(root);
    expect(create).toHaveBeenCalledWith('acme', sent('spend', 2_500_750_000, 1));
    expect(onDone).toHaveBeenCalledWith(true);
    create.mockRestore();
  });

  it('refuses an amount finer than a micro-unit, or written as 1.000,50, and sends nothing', async () => {
    const create = vi.spyOn(api, 'createTeam').mockResolvedValue({} as never);
    const root = mount(<NewTeam org="acme" money={{ spend: 'USD' }} onDone={vi.fn()} />);
    fill(root, 'spend', '12.3456789', '1.000,50');
    await submit(root);
    expect(create).not.toHaveBeenCalled();
    expect(root.querySelector('#new-team-limits\\[0\\]\\.limit-error')!.textContent).toBe('An amount has at most 6 decimals (a micro-unit of USD).');
    expect(root.querySelector('#new-team-user_limits\\[0\\]\\.limit-error')!.textContent).not.toBe('');
    create.mockRestore();
  });

  it('takes a metric that is not money in units', async () => {
    const create = vi.spyOn(api, 'createTeam').mockResolvedValue({} as never);
    const root = mount(<NewTeam org="acme" money={{ spend: 'USD' }} onDone={vi.fn()} />);
    fill(root, 'requests', '10k', '250');
    expect(label(root, 'new-team-limits[0].limit')).toBe('Month limit of the team');
    await submit(root);
    expect(create).toHaveBeenCalledWith('acme', sent('requests', 10_000, 250));
    create.mockRestore();
  });
});
