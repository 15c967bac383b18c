import { afterAll, afterEach, describe, expect, it, vi } from 'vitest';
import { render } from 'preact';
import { act } from 'preact/test-utils';
import { App } from './App';

afterEach(() => { vi.unstubAllGlobals(); document.body.innerHTML = ''; });
// Preact runs effects after the next frame, or after a 35 ms timer where a frame does
// not come; such a timer left when jsdom is torn down calls cancelAnimationFrame after it
// is gone. Timers fire in the order they end, so waiting out a longer one lets the
// last of them run while jsdom is still there.
afterAll(async () => { await new Promise((r) => setTimeout(r, 150)); });

async function mountAt(path: string, session: Response) {
  history.replaceState(null, '', path);
  vi.stubGlobal('fetch', vi.fn(async () => session.clone()));
  const root = document.createElement('div');
  document.body.appendChild(root);
  await act(async () => { render(<App />, root); });
  await act(async () => { await new Promise((r) => setTimeout(r, 10)); });
  return root;
}

describe('the page title', () => {
  it('is "Sign in" on the sign-in form, whatever page the address names', async () => {
    for (const path of ['/console/', '/console/allocation']) {
      const root = await mountAt(path, new Response(null, { status: 204 }));
      expect(root.querySelector('h1')!.textContent).toBe('Sign in to Quotaplane');
      expect(document.title).toBe('Sign in · Quotaplane console');
      render(null, root);
    }
  });
});

describe('the sign-in form', () => {
  it('names the organization: from ?org=, else the one this browser signed in to last', async () => {
    localStorage.removeItem('quotaplane.console.org');
    let root = await mountAt('/console/?org=demo', new Response(null, { status: 204 }));
    expect((root.querySelector('#org') as HTMLInputElement).value).toBe('demo');
    render(null, root);
    root = await mountAt('/console/', new Response(null, { status: 204 }));
    expect((root.querySelector('#org') as HTMLInputElement).value).toBe('');
    render(null, root);
    localStorage.setItem('quotaplane.console.org', 'acme');
    root = await mountAt('/console/', new Response(null, { status: 204 }));
    expect((root.querySelector('#org') as HTMLInputElement).value).toBe('acme');
    render(null, root);
    localStorage.removeItem('quotaplane.console.org');
  });

  it('sends the organization with the email and password', async () => {
    const root = await mountAt('/console/?org=demo', new Response(null, { status: 204 }));
    const calls: [string, RequestInit | undefined][] = [];
    vi.stubGlobal('fetch', vi.fn(async (url: string, init?: RequestInit) => {
      calls.push([url, init]);
      return new Response(JSON.stringify({ status: 401, title: 'Unauthorized', detail: 'wrong organization, email or password' }),
        { status: 401, headers: { 'Content-Type': 'application/problem+json' } });
    }));
    const set = (id: string, v: string) => {
      const el = root.querySelector(id) as HTMLInputElement;
      el.value = v;
      el.dispatchEvent(new Event('input', { bubbles: true }));
    };
    await act(async () => { set('#email', 'admin@demo.test'); set('#password', 'secret-password'); });
    await act(async () => { (root.querySelector('form') as HTMLFormElement).dispatchEvent(new Event('submit', { cancelable: true, bubbles: true })); });
    await act(async () => { await new Promise((r) => setTimeout(r, 10)); });
    const signIn = calls.find(([u]) => String(u).includes('/console/api/sign-in'));
    expect(signIn).toBeDefined();
    expect(JSON.parse(String(signIn![1]!.body))).toEqual({ org: 'demo', email: 'admin@demo.test', password: 'secret-password' });
    render(null, root);
  });
});
