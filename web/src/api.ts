// The console's client of the /v1 API. The browser sends the session cookie itself;
// every change carries the session's CSRF token.

export type Window = 'second' | 'minute' | 'hour' | 'day' | 'month';
export const WINDOWS: Window[] = ['second', 'minute', 'hour', 'day', 'month'];
export type Mode = 'enforce' | 'shadow' | 'warn';
export const MODES: Mode[] = ['enforce', 'shadow', 'warn'];
export type Scope = 'check' | 'admin' | 'billing';

export interface Limit { metric: string; window: Window; limit: number }
export interface Session { user_id: string; email: string; org: string; role: 'admin' | 'viewer'; csrf_token: string; expires_at: string }
export interface Org {
  id: string; name: string; plan: string; limits: Limit[]; effective_limits: Limit[];
  mode: Mode; oversubscribe: boolean; billing_anchor_day: number;
}
export interface Team { id: string; org: string; name: string; limits: Limit[]; user_limits: Limit[] }
export interface User { id: string; org: string; team: string; limits: Limit[] }
export interface APIKey { id: string; name: string; prefix: string; scopes: Scope[]; created_at: string; last_used_at: string | null; revoked_at: string | null }
export interface NewKey extends APIKey { secret: string }
export interface AuditEntry { id: number; actor: string; action: string; object: string; before: unknown; after: unknown; time?: string; at?: string }
export interface WindowUsage { window: Window; limit: number; used: number; remaining: number }
// reserved: units held by open reservations (they count against limits as used units do).
export interface UsageLevel { id: string; team?: string; used: number; reserved?: number; limits: WindowUsage[] }
/** DailyUsage is the org's cumulative usage of the period at the end of a UTC day ("2026-11-03"). */
export interface DailyUsage { day: string; used: number }
export interface MetricUsage { metric: string; org: UsageLevel; teams: UsageLevel[]; users: UsageLevel[]; daily?: DailyUsage[] }
export interface Webhook {
  url: string | null; signing_secret: string | null; signature_header: string; events: string[]; note?: string;
  /** Why the worker would refuse url by default (a loopback or private address). */
  url_warning?: string;
}
export interface WebhookDelivery {
  id: number; event: string; event_id: number; url: string; attempt: number;
  status_code: number | null; error: string | null; succeeded: boolean; at: string;
}
export interface Usage { org: string; period: string; period_start: string; period_end: string; metrics: MetricUsage[] }
export interface Throttle { scope: 'org' | 'plan'; factor: number; month: boolean; reason: string; expires_at: string; created_at: string; created_by: string }
export interface Page<T> { items: T[]; next_cursor: string | null }

export interface FieldError { field: string; message: string }

/** ApiError is a problem document (RFC 9457) the API answered with. */
export class ApiError extends Error {
  status: number;
  errors: FieldError[];
  constructor(status: number, detail: string, errors: FieldError[] = []) {
    super(detail);
    this.status = status;
    this.errors = errors;
  }
  /** The message for one field, e.g. "limits[0].limit", if the API named it. */
  fieldMessage(field: string): string | undefined {
    return this.errors.find((e) => e.field === field)?.message;
  }
}

let csrfToken = '';
export function setCSRFToken(t: string) { csrfToken = t; }

/** onSessionEnded runs when the API says the session is gone (401). */
let onSessionEnded: () => void = () => {};
export function setOnSessionEnded(fn: () => void) { onSessionEnded = fn; }

/** Requests still waiting for an answer; signing out cancels them. */
const inFlight = new Set<AbortController>();

/**
 * cancelPending aborts every request still waiting for an answer. Signing out calls it
 * first: a page's load that is answered after the session ended would otherwise come
 * back 401, and the browser logs every 401 as an error. A cancelled request's promise
 * never settles, so no page shows an error for it while the console unmounts.
 */
export function cancelPending() {
  for (const c of inFlight) c.abort();
  inFlight.clear();
}

export async function request<T>(method: string, path: string, body?: unknown): Promise<T> {
  const headers: Record<string, string> = { Accept: 'application/json' };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  if (method !== 'GET' && method !== 'HEAD') headers['X-CSRF-Token'] = csrfToken;
  const ctl = new AbortController();
  inFlight.add(ctl);
  let res: Response;
  let text: string;
  try {
    res = await fetch(path, { method, headers, credentials: 'same-origin', signal: ctl.signal, body: body === undefined ? undefined : JSON.stringify(body) });
    text = res.status === 204 ? '' : await res.text();
  } catch {
    if (ctl.signal.aborted) return new Promise<T>(() => {});
    throw new ApiError(0, 'The server cannot be reached. Check your connection and try again.');
  } finally {
    inFlight.delete(ctl);
  }
  if (ctl.signal.aborted) return new Promise<T>(() => {});
  if (res.status === 204) return undefined as T;
  let data: unknown = undefined;
  try { data = text ? JSON.parse(text) : undefined; } catch { /* not JSON */ }
  if (!res.ok) {
    const p = (data ?? {}) as { detail?: string; title?: string; errors?: FieldError[] };
    if (res.status === 401 && !path.startsWith('/console/api/sign-in')) onSessionEnded();
    throw new ApiError(res.status, p.detail || p.title || `${res.status} ${res.statusText}`, p.errors ?? []);
  }
  return data as T;
}

const o = (org: string) => `/v1/orgs/${encodeURIComponent(org)}`;
const e = encodeURIComponent;

export const api = {
  session: () => request<Session | undefined>('GET', '/console/api/session'), // undefined: not signed in
  signIn: (email: string, password: string) => request<Session>('POST', '/console/api/sign-in', { email, password }),
  signOut: () => { cancelPending(); return request<void>('POST', '/console/api/sign-out'); },

  org: (org: string) => request<Org>('GET', o(org)),
  setMode: (org: string, mode: Mode) => request<Org>('PATCH', o(org), { mode }),
  throttle: (org: string) => request<Throttle | undefined>('GET', `${o(org)}/throttle`), // undefined (204): none in force
  usage: (org: string, period?: string) => request<Usage>('GET', `${o(org)}/usage${period ? `?period=${e(period)}` : ''}`),

  teams: (org: string) => request<Page<Team>>('GET', `${o(org)}/teams?limit=1000`),
  createTeam: (org: string, t: { id: string; name: string; limits: Limit[]; user_limits: Limit[] }) => request<Team>('POST', `${o(org)}/teams`, t),
  patchTeam: (org: string, team: string, p: Partial<Pick<Team, 'name' | 'limits' | 'user_limits'>>) => request<Team>('PATCH', `${o(org)}/teams/${e(team)}`, p),
  deleteTeam: (org: string, team: string) => request<void>('DELETE', `${o(org)}/teams/${e(team)}`),

  users: (org: string, team: string) => request<Page<User>>('GET', `${o(org)}/teams/${e(team)}/users?limit=1000`),
  createUser: (org: string, team: string, u: { id: string; limits: Limit[] }) => request<User>('POST', `${o(org)}/teams/${e(team)}/users`, u),
  patchUser: (org: string, team: string, user: string, p: { limits: Limit[] }) => request<User>('PATCH', `${o(org)}/teams/${e(team)}/users/${e(user)}`, p),
  deleteUser: (org: string, team: string, user: string) => request<void>('DELETE', `${o(org)}/teams/${e(team)}/users/${e(user)}`),

  keys: (org: string) => request<Page<APIKey>>('GET', `${o(org)}/api-keys?limit=1000`),
  createKey: (org: string, name: string, scopes: Scope[]) => request<NewKey>('POST', `${o(org)}/api-keys`, { name, scopes }),
  revokeKey: (org: string, key: string) => request<void>('DELETE', `${o(org)}/api-keys/${e(key)}`),

  audit: (org: string, cursor?: string) => request<Page<AuditEntry>>('GET', `${o(org)}/audit?limit=50${cursor ? `&cursor=${e(cursor)}` : ''}`),
  webhook: (org: string) => request<Webhook>('GET', `${o(org)}/webhook`),
  webhookDeliveries: (org: string, cursor?: string) => request<Page<WebhookDelivery>>('GET', `${o(org)}/webhook-deliveries?limit=50${cursor ? `&cursor=${e(cursor)}` : ''}`),
  exportURL: (org: string, period: string, format: 'csv' | 'json') => `${o(org)}/billing/export?period=${e(period)}&format=${format}`,
};
