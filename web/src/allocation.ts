// Allocation with usage: every team and user with used against allocated for each
// limit, how close each is to exhaustion and, for month limits, when it runs out at
// the pace so far. Pure, tested with Vitest.
import type { Limit, Reservation, Team, Usage, User, Window } from './api';
import { ratio } from './format';

/** mergeLimits is the API's rule for a user: the team's user defaults, each (metric, window) overridden by the user's own. */
export function mergeLimits(defaults: Limit[], own: Limit[]): Limit[] {
  const out = new Map<string, Limit>();
  for (const l of [...defaults, ...own]) out.set(`${l.metric}/${l.window}`, l);
  return [...out.values()];
}

/** Forecast is when a month allocation runs out at the pace so far. */
export type Forecast =
  | { kind: 'exhausted' } // used it all already
  | { kind: 'runs-out'; at: Date } // before the period ends
  | { kind: 'lasts'; projected: number } // not this period; projected use at its end
  | { kind: 'idle' }; // nothing used yet: no pace to go by

/**
 * forecast extrapolates used, counted since start, at its average pace to the moment
 * it reaches limit. The pace is the period's so far (used / elapsed), the same the
 * overview's projection draws. held, units held by open reservations, counts against
 * the limit from now on but sets no pace: it is a one-off hold, not a rate.
 */
export function forecast(used: number, limit: number, start: Date, end: Date, now: Date, held = 0): Forecast {
  if (used + held >= limit && limit >= 0 && used + held > 0) return { kind: 'exhausted' };
  const elapsed = now.getTime() - start.getTime();
  if (used <= 0 || elapsed <= 0) return { kind: 'idle' };
  const pace = used / elapsed; // units per ms
  const at = new Date(now.getTime() + (limit - used - held) / pace);
  if (at.getTime() < end.getTime()) return { kind: 'runs-out', at };
  return { kind: 'lasts', projected: Math.round(used * ((end.getTime() - start.getTime()) / elapsed)) + held };
}

const dayFmt = new Intl.DateTimeFormat('en-GB', { day: 'numeric', month: 'short', timeZone: 'UTC' });
/** formatDay writes a UTC day as "28 Nov". */
export function formatDay(d: Date): string {
  return dayFmt.format(d);
}

/** forecastText says a forecast in the console's words. */
export function forecastText(f: Forecast | undefined): string {
  if (!f) return 'resets each window';
  switch (f.kind) {
    case 'exhausted': return 'used up';
    case 'runs-out': return `runs out on ${formatDay(f.at)}`;
    case 'lasts': return 'lasts the period';
    case 'idle': return 'nothing used yet';
  }
}

export interface AllocRow {
  kind: 'team' | 'user';
  id: string;
  team?: string; // a user's team
  registered: boolean; // a user with a record, or a team (always)
  metric: string;
  window: Window;
  limit: number;
  /**
   * burst is a token bucket's size (limit is then its rate per window): its used is the
   * tokens taken, and its share and colour go by the burst, what it holds.
   */
  burst?: number;
  /**
   * used is the units used (committed); reserved those held by open reservations, known
   * for month limits only (the usage API's `reserved`; a shorter window's bucket counts
   * held units in used). Both count against the limit, as the API counts them: ratio
   * and colour go by used + reserved; the forecast's pace by used alone.
   */
  used: number;
  reserved: number;
  /** inherited: the limit is the team's default for users, not the user's own. */
  inherited: boolean;
  ratio: number;
  forecast?: Forecast; // month limits only
}

export interface Period { start: Date; end: Date; now: Date }

/**
 * counted splits a window's use as the usage API reports it into used and reserved: a
 * month window's used counts the level's held units too (the API's WindowUsage.used),
 * which are the level's `reserved`; a shorter window's cannot be split.
 */
function counted(window: Window, windowUsed: number, levelReserved: number): { used: number; reserved: number } {
  if (window !== 'month') return { used: windowUsed, reserved: 0 };
  const reserved = Math.max(0, Math.min(levelReserved, windowUsed));
  return { used: windowUsed - reserved, reserved };
}

/** row makes an allocation row, with the share and colour of used + reserved and its forecast. */
function row(r: Omit<AllocRow, 'ratio' | 'forecast'>, p: Period): AllocRow {
  return { ...r, ratio: ratio(r.used + r.reserved, r.burst ?? r.limit),
    forecast: r.window === 'month' ? forecast(r.used, r.limit, p.start, p.end, p.now, r.reserved) : undefined };
}

/**
 * allocationRows lists one row per limit of every team and every user: registered
 * users (their own limits over their team's defaults) and users that used something
 * without a record (the limits the usage API reports for them: the defaults). Usage comes from the usage API, which lists only
 * levels that used anything; the rest used nothing.
 */
export function allocationRows(teams: Team[], users: Record<string, User[]>, usage: Usage | undefined, p: Period): AllocRow[] {
  const used = new Map<string, { used: number; reserved: number }>(); // "team:eng|requests|month" -> used, reserved
  const seen = new Map<string, { team: string; id: string; limits: Limit[] }>(); // users with usage, with their effective limits
  for (const mu of usage?.metrics ?? []) {
    for (const t of mu.teams) for (const w of t.limits) used.set(`team:${t.id}|${mu.metric}|${w.window}`, counted(w.window, w.used, t.reserved));
    for (const t of mu.teams) if (!t.limits.some((w) => w.window === 'month')) used.set(`team:${t.id}|${mu.metric}|month`, { used: t.used, reserved: t.reserved });
    for (const u of mu.users) {
      const team = u.team ?? '';
      const e = seen.get(`${team}/${u.id}`) ?? { team, id: u.id, limits: [] };
      e.limits.push(...u.limits.map((w) => (w.burst ? { metric: mu.metric, window: w.window, limit: w.limit, burst: w.burst } : { metric: mu.metric, window: w.window, limit: w.limit })));
      seen.set(`${team}/${u.id}`, e);
      for (const w of u.limits) used.set(`user:${team}/${u.id}|${mu.metric}|${w.window}`, counted(w.window, w.used, u.reserved));
      if (!u.limits.some((w) => w.window === 'month')) used.set(`user:${team}/${u.id}|${mu.metric}|month`, { used: u.used, reserved: u.reserved });
    }
  }
  const rows: AllocRow[] = [];
  const add = (kind: 'team' | 'user', id: string, team: string | undefined, registered: boolean, ls: Limit[], own: Limit[]) => {
    const key = kind === 'team' ? `team:${id}` : `user:${team}/${id}`;
    for (const l of ls) {
      const u = used.get(`${key}|${l.metric}|${l.window}`) ?? { used: 0, reserved: 0 };
      rows.push(row({ kind, id, team, registered, metric: l.metric, window: l.window, limit: l.limit, ...(l.burst ? { burst: l.burst } : {}), ...u,
        inherited: kind === 'user' && !own.some((o) => o.metric === l.metric && o.window === l.window) }, p));
    }
  };
  for (const t of teams) {
    add('team', t.id, undefined, true, t.limits, t.limits);
    const registered = users[t.id] ?? [];
    for (const u of registered) add('user', u.id, t.id, true, mergeLimits(t.user_limits, u.limits), u.limits);
    // Users without a record: the limits the usage API applied to them (the defaults).
    for (const e of seen.values()) {
      if (e.team === t.id && !registered.some((u) => u.id === e.id)) add('user', e.id, t.id, false, e.limits, []);
    }
  }
  return rows;
}

export type SortKey = 'exhaustion' | 'name';

/**
 * Tiers of closeness to exhaustion, in order (see sortRows): month limits used up or
 * running out this period; the other month limits and the day limits with something
 * used or held; the shorter windows (hour, minute, second) and concurrent limits with
 * something used or held, which come back each window or as holders settle; last,
 * every limit with nothing used or held.
 */
export const EXHAUSTION_ORDER = 'Month limits that run out this period come first, soonest first; then month and day limits, the fullest first; '
  + 'then hour, minute and second windows and in-flight limits, which reset each window or free as holders settle.';

function tier(r: AllocRow): number {
  if (r.used + r.reserved <= 0) return 3;
  if (r.window === 'month') return r.forecast?.kind === 'exhausted' || r.forecast?.kind === 'runs-out' ? 0 : 1;
  return r.window === 'day' ? 1 : 2;
}

/** runOutTime orders the first tier: used up first, then the earliest run-out. */
function runOutTime(f: Forecast | undefined): number {
  if (f?.kind === 'exhausted') return -Infinity;
  if (f?.kind === 'runs-out') return f.at.getTime();
  return Infinity;
}

/**
 * sortRows orders rows by closeness to exhaustion or by name (teams, each followed by
 * its users). Closeness goes by tier (EXHAUSTION_ORDER): a minute window used up frees
 * within the minute, while a month limit running out stays out until the period ends,
 * so no short window outranks a month or day limit with something used. Within the
 * first tier the earliest run-out leads (the fullest first among those used up); within
 * the others the highest share used; then the name.
 */
export function sortRows(rows: AllocRow[], by: SortKey): AllocRow[] {
  const name = (r: AllocRow) => (r.kind === 'team' ? `${r.id}\u0000` : `${r.team}\u0000${r.id}`);
  const byName = (a: AllocRow, b: AllocRow) => name(a).localeCompare(name(b)) || a.metric.localeCompare(b.metric) || a.window.localeCompare(b.window);
  if (by === 'name') return [...rows].sort(byName);
  return [...rows].sort((a, b) => tier(a) - tier(b) || runOutTime(a.forecast) - runOutTime(b.forecast) || b.ratio - a.ratio || byName(a, b));
}

/**
 * usageRows lists one row per limit of every team and user that used anything, from the
 * usage API alone (its effective limits): the overview's "closest to exhaustion".
 */
export function usageRows(usage: Usage, p: Period): AllocRow[] {
  const rows: AllocRow[] = [];
  for (const mu of usage.metrics) {
    for (const [kind, levels] of [['team', mu.teams], ['user', mu.users]] as const) {
      for (const l of levels) {
        for (const w of l.limits) {
          rows.push(row({ kind, id: l.id, team: kind === 'user' ? l.team : undefined, registered: true, metric: mu.metric, window: w.window,
            limit: w.limit, ...(w.burst ? { burst: w.burst } : {}), ...counted(w.window, w.used, l.reserved), inherited: false }, p));
        }
      }
    }
  }
  return rows;
}

/** Held is a team or user holding units of a metric in open reservations. */
export interface Held { kind: 'team' | 'user'; id: string; team?: string; metric: string; reserved: number; used: number }

/**
 * heldRows lists the teams and users with units held by open reservations (the usage
 * API's `reserved` > 0), the most held first, then teams before users, then by name.
 */
export function heldRows(usage: Usage | undefined): Held[] {
  const out: Held[] = [];
  for (const mu of usage?.metrics ?? []) {
    for (const t of mu.teams) if (t.reserved > 0) out.push({ kind: 'team', id: t.id, metric: mu.metric, reserved: t.reserved, used: t.used });
    for (const u of mu.users) if (u.reserved > 0) out.push({ kind: 'user', id: u.id, team: u.team ?? '', metric: mu.metric, reserved: u.reserved, used: u.used });
  }
  const name = (h: Held) => (h.kind === 'team' ? `0${h.id}` : `1${h.team}\u0000${h.id}`);
  return out.sort((a, b) => b.reserved - a.reserved || name(a).localeCompare(name(b)) || a.metric.localeCompare(b.metric));
}

/** OpenList is the org's open reservations as far as they were loaded; complete is false when there were more. */
export interface OpenList { items: Reservation[]; complete: boolean }

/** heldMatches reports whether an open reservation holds units counted in a held row: a team's row counts its users' too. */
export function heldMatches(h: Held, r: Reservation): boolean {
  if (r.metric !== h.metric) return false;
  return h.kind === 'team' ? r.team === h.id : r.team === h.team && r.user === h.id;
}

/** openCount is how many of the loaded open reservations hold units of a held row. */
export function openCount(h: Held, open: OpenList): number {
  return open.items.filter((r) => heldMatches(h, r)).length;
}

/** InFlight is a level's units held at once by open reservations against a concurrent limit (usage's in_flight). */
export interface InFlight { kind: 'org' | 'team' | 'user'; id: string; team?: string; metric: string; inFlight: number; limit?: number }

/**
 * inFlightRows lists every level the usage API reports in_flight for (it has a
 * concurrent limit, or something in flight), with its concurrent limit when it has
 * one: the org first, then teams, then users, each the fullest first.
 */
export function inFlightRows(usage: Usage | undefined): InFlight[] {
  const out: InFlight[] = [];
  const add = (kind: InFlight['kind'], l: Usage['metrics'][number]['org'], metric: string) => {
    if (l.in_flight === undefined) return;
    const limit = l.limits.find((w) => w.window === 'concurrent')?.limit;
    out.push({ kind, id: l.id, team: kind === 'user' ? l.team ?? '' : undefined, metric, inFlight: l.in_flight, limit });
  };
  for (const mu of usage?.metrics ?? []) {
    add('org', mu.org, mu.metric);
    for (const t of mu.teams) add('team', t, mu.metric);
    for (const u of mu.users) add('user', u, mu.metric);
  }
  const rank = { org: 0, team: 1, user: 2 };
  const fill = (r: InFlight) => (r.limit ? r.inFlight / r.limit : r.inFlight > 0 ? 1 : 0);
  return out.sort((a, b) => rank[a.kind] - rank[b.kind] || fill(b) - fill(a) || a.metric.localeCompare(b.metric)
    || `${a.team ?? ''}\u0000${a.id}`.localeCompare(`${b.team ?? ''}\u0000${b.id}`));
}
