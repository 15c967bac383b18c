import { afterEach, describe, expect, it, vi } from 'vitest';
import { render } from 'preact';
import { act } from 'preact/test-utils';
import { App } from './App';

afterEach(() => { vi.unstubAllGlobals(); document.body.innerHTML = ''; });

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
