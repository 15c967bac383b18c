// The console's client of the /v1 API. The browser sends the session cookie itself;
// every change carries the session's CSRF token.

import type { components } from '../../sdk/typescript/src/schema';

// The API's types, generated from api/openapi.yaml by openapi-typescript (make generate;
// make check-generate fails on drift). Only the console's own session routes, which the
// /v1 contract does not describe, are typed by hand here.
type S = components['schemas'];
export type Window = S['Window'];
export const WINDOWS: Window[] = ['second', 'minute', 'hour', 'day', 'month', 'concurrent'];
export type Mode = S['Mode'];
export const MODES: Mode[] = ['enforce', 'shadow', 'warn'];
export type Scope = S['Scope'];

export type Limit = S['Limit'];
export type Org = S['Org'];
export type Team = S['Team'];
export type User = S['User'];
export type APIKey = S['ApiKey'];
export type NewKey = S['ApiKeyCreated'];
export type AuditEntry = S['AuditEntry'];
export type WindowUsage = S['WindowUsage'];
export type UsageLevel = S['UsageLevel'];
/** DailyUsage is the org's cumulative usage of the period at the end of a UTC day ("2026-11-03"). */
export type DailyUsage = S['DailyUsage'];
export type MetricUsage = S['MetricUsage'];
export type Usage = S['Usage'];
export type Webhook = S['Webhook'];
export type WebhookDelivery = S['WebhookDelivery'];
export type WebhookTestResult = S['WebhookTestResult'];
export type Throttle = S['Throttle'];
export type FieldError = S['FieldError'];
export type Reservation = S['Reservation'];
export type OrgFeatures = S['OrgFeatures'];
export type FeatureValue = S['FeatureValue'];
export interface Page<T> { items: T[]; next_cursor: string | null }

/** Session is the console's signed-in user (GET /console/api/session; not part of /v1). */
export interface Session { user_id: string; email: string; org: string; role: 'admin' | 'viewer'; csrf_token: string; expires_at: string }

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
  signIn: (org: string, email: string, password: string) => request<Session>('POST', '/console/api/sign-in', { org, email, password }),
  signOut: () => { cancelPending(); return request<void>('POST', '/console/api/sign-out'); },
  /** Changes the signed-in user's password; every session of the user ends, and the answer is a new one. */
  changePassword: (current: string, next: string) =>
    request<Session>('POST', '/console/api/password', { current_password: current, new_password: next }),

  org: (org: string) => request<Org>('GET', o(org)),
  setMode: (org: string, mode: Mode) => request<Org>('PATCH', o(org), { mode }),
  throttle: (org: string) => request<Throttle | undefined>('GET', `${o(org)}/throttle`), // undefined (204): none in force
  // Usage comes a page of users at a time; the console shows every user, so it follows
  // next_cursor and gathers each metric's users.
  usage: async (org: string, period?: string): Promise<Usage> => {
    const path = (cursor?: string) =>
      `${o(org)}/usage?limit=1000${period ? `&period=${e(period)}` : ''}${cursor ? `&cursor=${e(cursor)}` : ''}`;
    const all = await request<Usage>('GET', path());
    for (let next = all.next_cursor; next; ) {
      const page = await request<Usage>('GET', path(next));
      for (const m of page.metrics) {
        const have = all.metrics.find((x) => x.metric === m.metric);
        if (have) have.users.push(...m.users);
        else all.metrics.push(m);
      }
      next = page.next_cursor;
    }
    all.next_cursor = undefined;
    return all;
  },

  teams: (org: string) => request<Page<Team>>('GET', `${o(org)}/teams?limit=1000`),
  createTeam: (org: string, t: S['TeamCreate']) => request<Team>('POST', `${o(org)}/teams`, t),
  patchTeam: (org: string, team: string, p: S['TeamPatch']) => request<Team>('PATCH', `${o(org)}/teams/${e(team)}`, p),
  deleteTeam: (org: string, team: string) => request<void>('DELETE', `${o(org)}/teams/${e(team)}`),

  users: (org: string, team: string) => request<Page<User>>('GET', `${o(org)}/teams/${e(team)}/users?limit=1000`),
  createUser: (org: string, team: string, u: S['UserCreate']) => request<User>('POST', `${o(org)}/teams/${e(team)}/users`, u),
  patchUser: (org: string, team: string, user: string, p: S['UserPatch']) => request<User>('PATCH', `${o(org)}/teams/${e(team)}/users/${e(user)}`, p),
  deleteUser: (org: string, team: string, user: string) => request<void>('DELETE', `${o(org)}/teams/${e(team)}/users/${e(user)}`),

  keys: (org: string) => request<Page<APIKey>>('GET', `${o(org)}/api-keys?limit=1000`),
  createKey: (org: string, name: string, scopes: Scope[]) => request<NewKey>('POST', `${o(org)}/api-keys`, { name, scopes }),
  revokeKey: (org: string, key: string) => request<void>('DELETE', `${o(org)}/api-keys/${e(key)}`),

  audit: (org: string, cursor?: string) => request<Page<AuditEntry>>('GET', `${o(org)}/audit?limit=50${cursor ? `&cursor=${e(cursor)}` : ''}`),
  webhook: (org: string) => request<Webhook>('GET', `${o(org)}/webhook`),
  setWebhookURL: (org: string, url: string) => request<Org>('PATCH', o(org), { webhook_url: url }),
  testWebhook: (org: string) => request<WebhookTestResult>('POST', `${o(org)}/webhook/test`),
  webhookDeliveries: (org: string, cursor?: string) => request<Page<WebhookDelivery>>('GET', `${o(org)}/webhook-deliveries?limit=50${cursor ? `&cursor=${e(cursor)}` : ''}`),
  /** One page of the org's open reservations, soonest to expire first, as a Page. */
  openReservations: (org: string, q: { team?: string; user?: string; limit?: number; cursor?: string } = {}) =>
    request<S['ReservationList']>('GET', `${o(org)}/reservations?${new URLSearchParams(
      Object.entries(q).filter(([, v]) => v !== undefined && v !== '').map(([k, v]) => [k, String(v)]))}`)
      .then((l): Page<Reservation> => ({ items: l.reservations, next_cursor: l.next_cursor ?? null })),
  /** The org's plan features, the operator's overrides and what they resolve to (read-only here). */
  features: (org: string) => request<OrgFeatures>('GET', `${o(org)}/features`),
  exportURL: (org: string, period: string, format: 'csv' | 'json') => `${o(org)}/billing/export?period=${e(period)}&format=${format}`,
};
