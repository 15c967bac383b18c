import { afterEach, describe, expect, it, vi } from 'vitest';
import { api, ApiError, request, setOnSessionEnded } from './api';

/** A fetch that answers only when told to, and honours its AbortSignal like the browser's. */
function heldFetch() {
  const calls: { path: string; signal: AbortSignal; answer: (r: Response) => void }[] = [];
  const fetch = vi.fn((path: string, init: RequestInit) => new Promise<Response>((resolve, reject) => {
    const signal = init.signal as AbortSignal;
    signal.addEventListener('abort', () => reject(new DOMException('aborted', 'AbortError')));
    calls.push({ path, signal, answer: resolve });
  }));
  return { fetch, calls };
}

const settled = async (p: Promise<unknown>) => {
  let done = false;
  p.then(() => { done = true; }, () => { done = true; });
  await new Promise((r) => setTimeout(r, 20));
  return done;
};

afterEach(() => { vi.unstubAllGlobals(); setOnSessionEnded(() => {}); });

describe('signing out', () => {
  it('cancels loads still in flight, so none comes back 401 and none shows an error', async () => {
    const { fetch, calls } = heldFetch();
    vi.stubGlobal('fetch', fetch);
    const ended = vi.fn();
    setOnSessionEnded(ended);

    const load = request('GET', '/v1/orgs/acme/teams/eng/users?limit=1000');
    expect(calls).toHaveLength(1);
    const out = api.signOut();
    expect(calls[0].signal.aborted).toBe(true);
    expect(calls.map((c) => c.path)).toEqual(['/v1/orgs/acme/teams/eng/users?limit=1000', '/console/api/sign-out']);
    calls[1].answer(new Response(null, { status: 204 }));
    await expect(out).resolves.toBeUndefined();
    expect(await settled(load)).toBe(false); // neither data nor an error reaches the page
    expect(ended).not.toHaveBeenCalled();
  });

  it('leaves a failed request an error when nobody cancelled it', async () => {
    vi.stubGlobal('fetch', vi.fn(async () => { throw new TypeError('Failed to fetch'); }));
    await expect(request('GET', '/v1/orgs/acme')).rejects.toEqual(new ApiError(0, 'The server cannot be reached. Check your connection and try again.'));
  });

  it('reports a 401 as the end of the session', async () => {
    vi.stubGlobal('fetch', vi.fn(async () => new Response(JSON.stringify({ title: 'Unauthorized', detail: 'sign in again' }), { status: 401 })));
    const ended = vi.fn();
    setOnSessionEnded(ended);
    await expect(request('GET', '/v1/orgs/acme')).rejects.toMatchObject({ status: 401, message: 'sign in again' });
    expect(ended).toHaveBeenCalledOnce();
  });
});
