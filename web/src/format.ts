// Pure UI logic: formatting, limit forms and allocation arithmetic. Tested with Vitest.
import type { DailyUsage, Limit, Team, UsageLevel, Window } from './api';

const nf = new Intl.NumberFormat('en-US');

/** formatNumber writes an integer with thousands separators: 1234567 -> "1,234,567". */
export function formatNumber(n: number): string {
  return nf.format(n);
}

/**
 * formatNumbersIn writes the whole numbers of 4 or more digits in an API message with
 * thousands separators, as the console shows every other number: "it has 100000" ->
 * "it has 100,000". Only free-standing numbers (after a space or "(", before a space,
 * punctuation or the end) are touched, so ids such as "u-12345" or "team \"2024\"" keep theirs.
 */
export function formatNumbersIn(msg: string): string {
  return msg.replace(/(^|[\s(])(\d{4,})(?=$|[\s,;:)]|\.(?!\d))/g, (_, pre: string, n: string) => pre + formatNumber(Number(n)));
}

/** compact writes a number short for charts and tight cells: 1200 -> "1.2k", 5000000 -> "5M". */
export function compact(n: number): string {
  const abs = Math.abs(n);
  const units: [number, string][] = [[1e12, 'T'], [1e9, 'B'], [1e6, 'M'], [1e3, 'k']];
  for (const [size, suffix] of units) {
    if (abs >= size) {
      const v = n / size;
      return `${Number(v.toFixed(Math.abs(v) < 10 ? 1 : 0))}${suffix}`;
    }
  }
  return String(n);
}

/** ratio is used / limit, 1 for anything used of a zero limit. */
export function ratio(used: number, limit: number): number {
  if (limit <= 0) return used > 0 ? 1 : 0;
  return used / limit;
}

/** percent writes used of limit as a whole percentage: "42%". */
export function percent(used: number, limit: number): string {
  const r = ratio(used, limit) * 100;
  if (r > 0 && r < 1) return '<1%';
  return `${Math.floor(r)}%`;
}

export type Level = 'ok' | 'warn' | 'over';
/** level colours a usage bar: warn from 80 %, over at 100 %. */
export function level(used: number, limit: number): Level {
  const r = ratio(used, limit);
  if (r >= 1) return 'over';
  if (r >= 0.8) return 'warn';
  return 'ok';
}

export function windowLabel(w: Window): string {
  if (w === 'concurrent') return 'in flight at once (concurrent)';
  return w === 'month' ? 'per month (billing period)' : `per ${w}`;
}

/** BUCKET_WINDOWS are the windows a limit may carry a burst on (a token bucket). */
export const BUCKET_WINDOWS: readonly Window[] = ['second', 'minute', 'hour', 'day'];

/** bucketable reports whether a limit of window w may be a token bucket. */
export function bucketable(w: Window): boolean {
  return BUCKET_WINDOWS.includes(w);
}

/**
 * bucketText writes a limit with its burst as lists show it: "10 / second, burst 30",
 * or "" for a limit that is not a token bucket. amount writes a number (money, units).
 */
export function bucketText(l: Pick<Limit, 'window' | 'limit' | 'burst'>, amount: (n: number) => string = formatNumber): string {
  return l.burst ? `${amount(l.limit)} / ${l.window}, burst ${amount(l.burst)}` : '';
}

/**
 * parseBurst reads a burst field: empty is a sliding window (no burst), else a limit
 * of 1 or more (parseLimitIn).
 */
export function parseBurst(input: string, currency?: string): Parsed {
  if (input.trim() === '') return {};
  const p = parseLimitIn(input, currency);
  if (p.error) return { error: p.error.replace(/^Enter a limit\./, 'Enter a burst.') };
  if (p.value! < 1) return { error: 'A burst is 1 or more; leave it empty for a sliding window.' };
  return p;
}

const WINDOW_ORDER: Record<Window, number> = { second: 0, minute: 1, hour: 2, day: 3, month: 4, concurrent: 5 };

/** sortLimits orders limits by metric, then from the shortest window to month. */
export function sortLimits(ls: Limit[]): Limit[] {
  return [...ls].sort((a, b) => a.metric.localeCompare(b.metric) || WINDOW_ORDER[a.window] - WINDOW_ORDER[b.window]);
}

export interface Parsed { value?: number; error?: string }

/**
 * parseLimit reads what someone typed into a limit field: a whole number >= 0, with
 * optional separators ("1,000", "1 000", "1_000") and a k/M/B suffix ("60k", "1.5M").
 */
export function parseLimit(input: string): Parsed {
  const s = input.trim().replace(/[,_\s]/g, '');
  if (s === '') return { error: 'Enter a limit.' };
  const m = /^(\d+(?:\.\d+)?)([kKmMbB]?)$/.exec(s);
  if (!m) return { error: 'A limit is a whole number of 0 or more, like 5000 or 60k.' };
  const mult = { '': 1, k: 1e3, m: 1e6, b: 1e9 }[m[2].toLowerCase() as '' | 'k' | 'm' | 'b'];
  const v = Number(m[1]) * mult;
  if (!Number.isInteger(v)) return { error: 'A limit is a whole number.' };
  if (v > Number.MAX_SAFE_INTEGER) return { error: 'That limit is too large.' };
  return { value: v };
}

const ID_RE = /^[a-zA-Z0-9][a-zA-Z0-9._:@-]{0,127}$/;
/** idError tells what is wrong with an id, or undefined when it is valid. */
export function idError(id: string): string | undefined {
  if (id === '') return 'Enter an id.';
  if (!ID_RE.test(id)) return 'Use letters, digits and . _ : @ - (starting with a letter or digit), at most 128 characters.';
  return undefined;
}

/**
 * setLimit returns limits with metric/window set to value, or removed when value is
 * null; burst, when given, makes it a token bucket (undefined: a sliding window).
 */
export function setLimit(ls: Limit[], metric: string, window: Window, value: number | null, burst?: number): Limit[] {
  const rest = ls.filter((l) => !(l.metric === metric && l.window === window));
  if (value === null) return rest;
  const i = ls.findIndex((l) => l.metric === metric && l.window === window);
  const next: Limit = burst !== undefined ? { metric, window, limit: value, burst } : { metric, window, limit: value };
  if (i < 0) return [...rest, next];
  const out = [...ls];
  out[i] = next;
  return out;
}

/** limitField is the API's name of a limit's field in a request body ("limits[2].limit", or attr "burst": "limits[2].burst"). */
export function limitField(list: 'limits' | 'user_limits', ls: Limit[], metric: string, window: Window, attr: 'limit' | 'burst' = 'limit'): string {
  const i = ls.findIndex((l) => l.metric === metric && l.window === window);
  return `${list}[${i}].${attr}`;
}

export interface Remainder { metric: string; limit: number; allocated: number; available: number }

/**
 * remainder is, per metric with a month limit on the org, what the teams' month
 * allocations leave unallocated (negative when the org oversubscribes).
 */
export function remainder(orgLimits: Limit[], teams: Pick<Team, 'limits'>[]): Remainder[] {
  return orgLimits
    .filter((l) => l.window === 'month')
    .map((l) => {
      const allocated = teams.reduce((sum, t) => sum + (t.limits.find((x) => x.metric === l.metric && x.window === 'month')?.limit ?? 0), 0);
      return { metric: l.metric, limit: l.limit, allocated, available: l.limit - allocated };
    });
}

/** topByUsage returns the n levels that used the most, biggest first, skipping zeros. */
export function topByUsage(levels: UsageLevel[], n: number): UsageLevel[] {
  return levels.filter((l) => l.used > 0).sort((a, b) => b.used - a.used || a.id.localeCompare(b.id)).slice(0, n);
}

/** periodOf names the billing period (YYYY-MM) that contains d, in UTC. */
export function periodOf(d: Date): string {
  return `${d.getUTCFullYear()}-${String(d.getUTCMonth() + 1).padStart(2, '0')}`;
}

/** recentPeriods lists the n periods up to and including the one of now, newest first. */
export function recentPeriods(now: Date, n: number): string[] {
  const out: string[] = [];
  let y = now.getUTCFullYear();
  let m = now.getUTCMonth();
  for (let i = 0; i < n; i++) {
    out.push(`${y}-${String(m + 1).padStart(2, '0')}`);
    m--;
    if (m < 0) { m = 11; y--; }
  }
  return out;
}

/** periodFraction is how much of [start, end) has passed at now, from 0 to 1. */
export function periodFraction(start: Date, end: Date, now: Date): number {
  const total = end.getTime() - start.getTime();
  if (total <= 0) return 1;
  return Math.min(1, Math.max(0, (now.getTime() - start.getTime()) / total));
}

export type Point = [number, number];

/**
 * dailySeries turns the usage API's daily history of a metric (the org's cumulative
 * usage at the end of each UTC day with a recorded change) into chart points, x being
 * days since the period's start:
 * - actual: 0 at the start, then each recorded day at its end (x = day index + 1; a
 *   point later than now, i.e. today's, at now). A day without a point saw no change,
 *   so gaps carry the previous value forward, and in a running period the line goes on
 *   flat to now.
 * - projected: from the last real point (now) to the period's end at the average daily
 *   pace so far; empty once the period is over or before anything was used.
 * actual is empty when there is no history at all.
 */
export function dailySeries(daily: DailyUsage[], start: Date, end: Date, now: Date): { actual: Point[]; projected: Point[]; days: number } {
  const dayMs = 86400e3;
  const days = Math.round((end.getTime() - start.getTime()) / dayMs);
  const f = periodFraction(start, end, now);
  // Exact, not rounded: in the first minutes of a day a rounded now falls on the day's
  // start, and today's point would then replace the flat run before it (a ramp from 0).
  const nowX = f * days;
  if (daily.length === 0) return { actual: [], projected: [], days };
  const actual: Point[] = [[0, 0]];
  let prevIdx = -1;
  let prev = 0;
  for (const d of [...daily].sort((a, b) => a.day.localeCompare(b.day))) {
    const idx = Math.round((Date.parse(`${d.day}T00:00:00Z`) - start.getTime()) / dayMs);
    if (idx < 0 || idx >= days) continue;
    if (idx > prevIdx + 1 && idx > 0) actual.push([Math.min(idx, nowX), prev]); // no change until that day began
    const x = Math.min(idx + 1, nowX);
    const last = actual[actual.length - 1];
    if (idx === prevIdx && last[0] === x) last[1] = Math.max(last[1], d.used); // the same day twice
    else actual.push([x, d.used]); // at the same x as the flat run's end: a step, not a ramp
    prevIdx = idx;
    prev = Math.max(prev, d.used);
  }
  if (actual.length === 1) return { actual: [], projected: [], days };
  const [lastX, lastY] = actual[actual.length - 1];
  if (f < 1 && lastX < nowX) actual.push([nowX, lastY]);
  const projected: Point[] = f > 0 && f < 1 && lastY > 0 ? [[nowX, lastY], [days, Math.round(lastY / f)]] : [];
  return { actual, projected, days };
}

/**
 * onDayAxis moves dailySeries points (x: days since the period's start) onto the pace
 * chart's "day of the period" axis, which counts from 1 as a calendar does: the period's
 * day N spans [N, N + 1), so any time on the 27th day (27 Nov of a period from 1 Nov)
 * is at 27.x, not 26.x. The axis runs from 1 to days + 1 (the end of the last day).
 */
export function onDayAxis(points: Point[]): Point[] {
  return points.map(([x, y]) => [x + 1, y]);
}

/** dayOfPeriod is the 1-based day of the period a dailySeries x falls on (at most days). */
export function dayOfPeriod(x: number, days: number): number {
  return Math.max(1, Math.min(days, Math.floor(x) + 1));
}

/** formatTime writes an instant for tables: "2026-11-21 14:05 UTC". */
export function formatTime(iso: string | null | undefined): string {
  if (!iso) return '—';
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return '—';
  return `${d.toISOString().slice(0, 16).replace('T', ' ')} UTC`;
}

/** expiresIn says how long until an instant, for open reservations: "in 42 s", "in 5 min", "in 2 h 5 min", "expired". */
export function expiresIn(iso: string, now: Date): string {
  const s = Math.round((new Date(iso).getTime() - now.getTime()) / 1000);
  if (Number.isNaN(s)) return '—';
  if (s <= 0) return 'expired';
  if (s < 120) return `in ${s} s`;
  const min = Math.floor(s / 60);
  if (min < 120) return `in ${min} min`;
  return `in ${Math.floor(min / 60)} h${min % 60 ? ` ${min % 60} min` : ''}`;
}

// Money: usage of the metric `spend` is counted in micro-units of the plan's currency
// (1 USD = 1,000,000), and the API marks it with `currency`. Amounts are written from
// the integer by integer division (BigInt), never through a float, so no rounding error
// shows: 1234560000 -> "1,234.56".

/** MICROS is the micro-units of one unit of a currency. */
export const MICROS = 1_000_000n;

/**
 * formatMicros writes micro-units as an amount with two decimals and thousands
 * separators, rounded half up to the cent: 1234565000 -> "1,234.57", -5000 -> "-0.01".
 */
export function formatMicros(micros: number | bigint): string {
  const m = BigInt(micros);
  const neg = m < 0n;
  const cents = ((neg ? -m : m) + 5_000n) / 10_000n;
  const whole = (cents / 100n).toString().replace(/\B(?=(\d{3})+(?!\d))/g, ',');
  const frac = (cents % 100n).toString().padStart(2, '0');
  return `${neg && cents > 0n ? '-' : ''}${whole}.${frac}`;
}

/** currencyOf is the currency of a metric's usage: set only for `spend` (money), else undefined. */
export function currencyOf(mu: { metric: string } | undefined): string | undefined {
  const c = (mu as { currency?: unknown } | undefined)?.currency;
  return typeof c === 'string' && c !== '' ? c : undefined;
}

/** formatAmount writes units, or money with its currency when there is one: "1,234.56 USD". */
export function formatAmount(n: number, currency?: string): string {
  return currency ? `${formatMicros(n)} ${currency}` : formatNumber(n);
}

/** formatBare writes units, or money without its currency: what follows "of" in "1,234.56 USD of 2,000.00". */
export function formatBare(n: number, currency?: string): string {
  return currency ? formatMicros(n) : formatNumber(n);
}

/** formatUsedOf writes "used of limit": "1,234 of 2,000", or money "1,234.56 USD of 2,000.00". */
export function formatUsedOf(used: number, limit: number, currency?: string): string {
  return `${formatAmount(used, currency)} of ${formatBare(limit, currency)}`;
}

/** currencies maps each metric of a usage that is money to its currency: { spend: 'USD' }. */
export function currencies(usage: { metrics: { metric: string }[] } | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  for (const mu of usage?.metrics ?? []) {
    const c = currencyOf(mu);
    if (c) out[mu.metric] = c;
  }
  return out;
}

/**
 * formatMicrosExact writes micro-units as an exact amount, for limits: two decimals, or
 * as many (up to six) as the micro-units need, with thousands separators unless plain:
 * 200000000 -> "200.00", 1234567 -> "1.234567", 1234500000000 -> "1,234,500.00" (plain:
 * "1234500.00", what the editor's field starts with).
 */
export function formatMicrosExact(micros: number | bigint, plain = false): string {
  const m = BigInt(micros);
  const abs = m < 0n ? -m : m;
  let whole = (abs / MICROS).toString();
  if (!plain) whole = whole.replace(/\B(?=(\d{3})+(?!\d))/g, ',');
  const frac = (abs % MICROS).toString().padStart(6, '0').replace(/0{1,4}$/, '');
  return `${m < 0n ? '-' : ''}${whole}.${frac}`;
}

/**
 * parseMoney reads an amount of currency typed into a limit field into micro-units,
 * by string and BigInt arithmetic (never a float): "500", "12.50", "1,000.25",
 * "0.000001", optionally followed by the currency ("500 USD"). Separators must group
 * thousands, so "1.000,50" is refused rather than read as 1.0005; more than six
 * decimals (finer than a micro-unit) are refused rather than rounded.
 */
export function parseMoney(input: string, currency: string): Parsed {
  let s = input.trim();
  if (currency && s.toUpperCase().endsWith(currency.toUpperCase())) s = s.slice(0, s.length - currency.length).trim();
  if (s === '') return { error: `Enter an amount of ${currency}.` };
  const m = /^(\d{1,3}(?:[,_ ]\d{3})+|\d*)(?:\.(\d*))?$/.exec(s);
  if (!m || m[1] + (m[2] ?? '') === '') return { error: `An amount is ${currency} of 0 or more, like 500 or 12.50.` };
  const frac = m[2] ?? '';
  if (frac.length > 6) return { error: `An amount has at most 6 decimals (a micro-unit of ${currency}).` };
  const micros = BigInt(m[1].replace(/[,_ ]/g, '') || '0') * MICROS + BigInt(frac.padEnd(6, '0'));
  if (micros > BigInt(Number.MAX_SAFE_INTEGER)) return { error: 'That amount is too large.' };
  return { value: Number(micros) };
}

/** parseLimitIn reads a limit field: units (parseLimit), or, for a metric that is money, an amount of its currency into micro-units (parseMoney). */
export function parseLimitIn(input: string, currency?: string): Parsed {
  return currency ? parseMoney(input, currency) : parseLimit(input);
}

/**
 * urlPieces splits a URL (or a module path) after each point where it may break over
 * lines: after "/" (a "//" stays whole), ".", "?", "&", "=", "#" and "-". Joined, the
 * pieces are the URL again; no piece is broken inside.
 */
export function urlPieces(url: string): string[] {
  return url.split(/(?<=[/.?&=#-])(?!\/)/).filter((p) => p !== '');
}
