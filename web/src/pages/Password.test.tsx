import { afterEach, describe, expect, it, vi } from 'vitest';
import { render } from 'preact';
import { act } from 'preact/test-utils';
import { Password } from './Password';
import { api, type Session } from '../api';

afterEach(() => { vi.unstubAllGlobals(); document.body.innerHTML = ''; });

const session: Session = { user_id: 'u1', email: 'ada@acme.test', org: 'acme', role: 'viewer', csrf_token: 'old-token', expires_at: '2030-01-01T00:00:00Z' };

function type(root: HTMLElement, id: string, value: string) {
  const el = root.querySelector<HTMLInputElement>('#' + id)!;
  el.value = value;
  el.dispatchEvent(new Event('input', { bubbles: true }));
}

describe('the password form', () => {
  it('sends the current and the new password with the CSRF token, then uses the new session\'s token', async () => {
    const calls: [string, RequestInit | undefined][] = [];
    vi.stubGlobal('fetch', vi.fn(async (url: string, init?: RequestInit) => {
      calls.push([url, init]);
      return new Response(JSON.stringify({ ...session, csrf_token: 'new-token' }), { status: 200, headers: { 'Content-Type': 'application/json' } });
    }));
    const { setCSRFToken } = await import('../api');
    setCSRFToken('old-token');
    const root = document.createElement('div');
    document.body.appendChild(root);
    await act(async () => { render(<Password session={session} />, root); });
    await act(async () => { type(root, 'current-password', 'correct horse battery'); });
    await act(async () => { type(root, 'new-password', 'a much better passphrase'); });
    await act(async () => { type(root, 'new-password-again', 'a much better passphrase'); });
    await act(async () => { root.querySelector('form')!.dispatchEvent(new Event('submit', { cancelable: true })); });
    await act(async () => { await new Promise((r) => setTimeout(r, 10)); });
    expect(calls[0][0]).toBe('/console/api/password');
    expect(JSON.parse(calls[0][1]!.body as string)).toEqual({ current_password: 'correct horse battery', new_password: 'a much better passphrase' });
    expect((calls[0][1]!.headers as Record<string, string>)['X-CSRF-Token']).toBe('old-token');
    expect(root.querySelector('[role=status]')!.textContent).toContain('Password changed');
    await api.signOut();
    expect((calls[1][1]!.headers as Record<string, string>)['X-CSRF-Token']).toBe('new-token');
  });

  it('refuses a repetition that differs, sending nothing', async () => {
    const fetch = vi.fn();
    vi.stubGlobal('fetch', fetch);
    const root = document.createElement('div');
    document.body.appendChild(root);
    await act(async () => { render(<Password session={session} />, root); });
    await act(async () => { type(root, 'current-password', 'correct horse battery'); });
    await act(async () => { type(root, 'new-password', 'a much better passphrase'); });
    await act(async () => { type(root, 'new-password-again', 'a much better passphrase!'); });
    await act(async () => { root.querySelector('form')!.dispatchEvent(new Event('submit', { cancelable: true })); });
    expect(fetch).not.toHaveBeenCalled();
    expect(root.querySelector('[role=alert]')!.textContent).toContain('differ');
  });
});
