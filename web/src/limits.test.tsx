import { describe, expect, it, vi } from 'vitest';
import { render } from 'preact';
import { act } from 'preact/test-utils';
import { LimitsEditor } from './limits';
import { ApiError } from './api';

function mount(ui: preact.ComponentChild) {
  const root = document.createElement('div');
  document.body.appendChild(root);
  act(() => render(ui, root));
  return root;
}

const limits = [{ metric: 'requests', window: 'month' as const, limit: 1000 }];

describe('LimitsEditor', () => {
  it('shows no edit controls when it cannot edit', () => {
    const root = mount(<LimitsEditor label="Team eng" idPrefix="t" list="limits" limits={limits} canEdit={false} onSave={vi.fn()} />);
    expect(root.querySelectorAll('button, input').length).toBe(0);
    expect(root.textContent).toContain('1,000');
  });

  it('puts the 422 message of the edited field beside it', async () => {
    const onSave = vi.fn().mockRejectedValue(new ApiError(422, 'whole detail', [{ field: 'limits[0].limit', message: 'it has 100000, 80000 is already allocated' }]));
    const root = mount(<LimitsEditor label="Team eng" idPrefix="t" list="limits" limits={limits} canEdit onSave={onSave} />);
    act(() => (root.querySelector('button.inline-edit') as HTMLButtonElement).click());
    const input = root.querySelector('input[name="limit"]') as HTMLInputElement;
    act(() => { input.value = '90k'; input.dispatchEvent(new Event('input', { bubbles: true })); });
    await act(async () => { root.querySelector('form')!.dispatchEvent(new Event('submit', { bubbles: true, cancelable: true })); });
    expect(onSave).toHaveBeenCalledWith([{ metric: 'requests', window: 'month', limit: 90000 }]);
    const err = root.querySelector('.field-error')!;
    expect(err.textContent).toBe('it has 100,000, 80,000 is already allocated');
    expect(input.getAttribute('aria-describedby')).toBe(err.id);
  });

  it('refuses a malformed limit without calling the API', async () => {
    const onSave = vi.fn();
    const root = mount(<LimitsEditor label="Team eng" idPrefix="t2" list="limits" limits={limits} canEdit onSave={onSave} />);
    act(() => (root.querySelector('button.inline-edit') as HTMLButtonElement).click());
    const input = root.querySelector('input[name="limit"]') as HTMLInputElement;
    act(() => { input.value = '-5'; input.dispatchEvent(new Event('input', { bubbles: true })); });
    await act(async () => { root.querySelector('form')!.dispatchEvent(new Event('submit', { bubbles: true, cancelable: true })); });
    expect(onSave).not.toHaveBeenCalled();
    expect(root.querySelector('.field-error')!.textContent).toMatch(/whole number/);
  });
});

describe('a registered user without limits of its own', () => {
  const defaults = { limits: [{ metric: 'requests', window: 'month' as const, limit: 5000 }], from: 'the user defaults of eng' };
  it('shows the team defaults that apply, not "only the levels above apply"', () => {
    const root = mount(<LimitsEditor label="User dave" idPrefix="u1" list="limits" limits={[]} canEdit={false} onSave={vi.fn()} defaults={defaults} />);
    expect(root.textContent).not.toContain('only the levels above apply');
    const row = root.querySelector('[data-testid="inherited-limit"]')!;
    expect(row.textContent).toContain('5,000');
    expect(root.textContent).toContain('No limits of its own: the user defaults of eng apply.');
  });
  it('shows a default only where the user has no limit of that metric and window', () => {
    const own = [{ metric: 'requests', window: 'month' as const, limit: 800 }, { metric: 'requests', window: 'minute' as const, limit: 5 }];
    const root = mount(<LimitsEditor label="User alice" idPrefix="u2" list="limits" limits={own} canEdit onSave={vi.fn()}
      defaults={{ ...defaults, limits: [...defaults.limits, { metric: 'tokens', window: 'day' as const, limit: 70 }] }} />);
    const inherited = [...root.querySelectorAll('[data-testid="inherited-limit"]')].map((r) => r.textContent);
    expect(inherited).toEqual(['tokensday70default']);
    expect(root.textContent).toContain('Where it has none of its own, the user defaults of eng apply.');
  });
  it('still says nothing applies when the team has no defaults either', () => {
    const root = mount(<LimitsEditor label="User erin" idPrefix="u3" list="limits" limits={[]} canEdit={false} onSave={vi.fn()} defaults={{ limits: [], from: 'the user defaults of ops' }} />);
    expect(root.textContent).toContain('No limits: only the levels above apply.');
  });
});

describe('a token bucket in the limits editor', () => {
  const bucket = [{ metric: 'requests', window: 'second' as const, limit: 10, burst: 30 }];
  const type = (root: Element, sel: string, v: string) => {
    const input = root.querySelector(sel) as HTMLInputElement;
    act(() => { input.value = v; input.dispatchEvent(new Event('input', { bubbles: true })); });
    return input;
  };
  const submit = async (root: Element) => {
    await act(async () => { root.querySelector('form')!.dispatchEvent(new Event('submit', { bubbles: true, cancelable: true })); });
  };

  it('shows a bucket with its burst', () => {
    const root = mount(<LimitsEditor label="Team eng" idPrefix="b1" list="limits" limits={bucket} canEdit={false} onSave={vi.fn()} />);
    expect(root.textContent).toContain('10, burst 30');
  });

  it('offers a burst for second to day windows only, and sends it', async () => {
    const onSave = vi.fn().mockResolvedValue(undefined);
    const root = mount(<LimitsEditor label="Team eng" idPrefix="b2" list="limits" limits={limits} canEdit onSave={onSave} />);
    act(() => (root.querySelector('button.link') as HTMLButtonElement).click());
    expect(root.querySelector('input[name="burst"]')).toBeNull(); // month, the default window
    const sel = root.querySelector('select[name="window"]') as HTMLSelectElement;
    act(() => { sel.value = 'second'; sel.dispatchEvent(new Event('change', { bubbles: true })); });
    type(root, 'input[name="limit"]', '10');
    type(root, 'input[name="burst"]', '30');
    await submit(root);
    expect(onSave).toHaveBeenCalledWith([...limits, { metric: 'requests', window: 'second', limit: 10, burst: 30 }]);
  });

  it('sends no burst when the field is emptied: a sliding window', async () => {
    const onSave = vi.fn().mockResolvedValue(undefined);
    const root = mount(<LimitsEditor label="Team eng" idPrefix="b3" list="limits" limits={bucket} canEdit onSave={onSave} />);
    act(() => (root.querySelector('button.inline-edit') as HTMLButtonElement).click());
    expect((root.querySelector('input[name="burst"]') as HTMLInputElement).value).toBe('30');
    type(root, 'input[name="burst"]', '');
    await submit(root);
    expect(onSave).toHaveBeenCalledWith([{ metric: 'requests', window: 'second', limit: 10 }]);
  });

  it('refuses a burst of 0 without calling the API', async () => {
    const onSave = vi.fn();
    const root = mount(<LimitsEditor label="Team eng" idPrefix="b4" list="limits" limits={bucket} canEdit onSave={onSave} />);
    act(() => (root.querySelector('button.inline-edit') as HTMLButtonElement).click());
    type(root, 'input[name="burst"]', '0');
    await submit(root);
    expect(onSave).not.toHaveBeenCalled();
    expect(root.querySelector('.field-error')!.textContent).toMatch(/burst is 1 or more/);
  });

  it('puts the 422 about the burst beside the burst field', async () => {
    const onSave = vi.fn().mockRejectedValue(new ApiError(422, 'whole detail', [{ field: 'limits[0].burst', message: 'team "eng": requests/second burst 4000 is above org "acme"\'s burst 3000' }]));
    const root = mount(<LimitsEditor label="Team eng" idPrefix="b5" list="limits" limits={bucket} canEdit onSave={onSave} />);
    act(() => (root.querySelector('button.inline-edit') as HTMLButtonElement).click());
    const burst = type(root, 'input[name="burst"]', '4000');
    await submit(root);
    const err = root.querySelector('.field-error')!;
    expect(err.textContent).toBe('team "eng": requests/second burst 4,000 is above org "acme"\'s burst 3,000');
    expect(burst.getAttribute('aria-describedby')).toBe(err.id);
    expect((root.querySelector('input[name="limit"]') as HTMLInputElement).getAttribute('aria-invalid')).toBeNull();
  });
});
