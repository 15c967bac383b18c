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
    expect(err.textContent).toBe('it has 100000, 80000 is already allocated');
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
