// The shadow and warn report: who enforcing would have blocked in a period, per limit
// (level, id, metric, window) and per day, so an admin can see who would be hurt
// before switching the org from shadow or warn to enforce.
import type { ComponentChildren } from 'preact';
import { useState } from 'preact/hooks';
import type { components } from '../../../sdk/typescript/src/schema';
import { request, type Session } from '../api';
import { formatNumber, recentPeriods, windowLabel } from '../format';
import { Empty, ErrorState, Id, Loading, useLoad } from '../ui';

export type WouldBlockReport = components['schemas']['WouldBlockReport'];
export type WouldBlockRow = components['schemas']['WouldBlockRow'];
type Day = components['schemas']['WouldBlockDay'];

export const REPORT_PATH = 'shadow-report';

const wouldBlock = (org: string, period?: string) =>
  request<WouldBlockReport>('GET', `/v1/orgs/${encodeURIComponent(org)}/would-block${period ? `?period=${encodeURIComponent(period)}` : ''}`);

/** periodDays lists the UTC days of [start, end) as YYYY-MM-DD. */
export function periodDays(start: string, end: string): string[] {
  const out: string[] = [];
  const e = new Date(end).getTime();
  for (let t = new Date(start).getTime(); t < e; t += 86_400_000) out.push(new Date(t).toISOString().slice(0, 10));
  return out;
}

/** dayCounts puts each day of the period with its count (0 when none), in order. */
export function dayCounts(days: string[], counts: Day[]): { day: string; checks: number; units: number }[] {
  const by = new Map(counts.map((d) => [d.day, d]));
  return days.map((day) => ({ day, checks: by.get(day)?.checks ?? 0, units: by.get(day)?.units ?? 0 }));
}

/** rowLabel names the row's limit in words, its level first (for the bars' labels). */
export function rowLabel(r: WouldBlockRow): string {
  if (r.level === 'other') return 'Other limits (beyond the cap)';
  return `${r.level} ${rowHeading(r)}`;
}

/**
 * rowHeading is what follows the row's level badge in the table: the limit without
 * the level word the badge already shows ("user alice (team eng): ...", never "user
 * user alice").
 */
export function rowHeading(r: WouldBlockRow): string {
  if (r.level === 'other') return 'limits beyond the cap';
  const who = r.level === 'user' ? `${r.id} (team ${r.team})` : `${r.id}`;
  return `${who}: ${r.metric} ${windowLabel(r.window!)}`;
}

/** RowHeading writes rowHeading with its ids as Id: cut short where they would not fit, whole in their title. */
function RowHeading({ r }: { r: WouldBlockRow }) {
  if (r.level === 'other') return <>{rowHeading(r)}</>;
  return <>{<Id id={r.id!} />}{r.level === 'user' && <> (team <Id id={r.team!} />)</>}: {r.metric} {windowLabel(r.window!)}</>;
}

/** ReportLink goes to the report without reloading the console (App listens to popstate). */
export function ReportLink({ children }: { children: ComponentChildren }) {
  const href = `/console/${REPORT_PATH}`;
  return (
    <a href={href} data-testid="shadow-report-link" onClick={(e) => {
      if (e.metaKey || e.ctrlKey || e.shiftKey || e.button !== 0) return;
      e.preventDefault();
      history.pushState(null, '', href);
      window.dispatchEvent(new PopStateEvent('popstate'));
    }}>{children}</a>
  );
}

const short = (day: string) => new Date(day + 'T00:00:00Z').toLocaleDateString('en-GB', { day: 'numeric', month: 'short', timeZone: 'UTC' });

function DayBars({ days, label, testid, axis }: { days: { day: string; checks: number; units: number }[]; label: string; testid: string; axis?: boolean }) {
  const peak = Math.max(1, ...days.map((d) => d.checks));
  const hit = days.filter((d) => d.checks > 0);
  return (
    <div class="day-chart">
    <div class="day-bars" role="img" data-testid={testid}
      aria-label={`${label}: ${hit.length ? hit.map((d) => `${short(d.day)} ${formatNumber(d.checks)}`).join(', ') : 'no day'}`}>
      {days.map((d) => (
        <span class={d.checks ? 'day hit' : 'day'} title={`${short(d.day)}: ${formatNumber(d.checks)} checks, ${formatNumber(d.units)} units`}
          style={{ height: `${d.checks ? Math.max(8, (d.checks / peak) * 100) : 4}%` }} />
      ))}
    </div>
    {axis ? (
      <div class="day-axis muted"><span>{short(days[0].day)}</span>
        <span data-testid={`${testid}-list`}>{hit.length ? `Would have blocked on ${hit.map((d) => `${short(d.day)} (${formatNumber(d.checks)})`).join(', ')}` : ''}</span>
        <span>{short(days[days.length - 1].day)}</span></div>
    ) : <div class="day-axis muted">{hit.length === 1 ? `on ${short(hit[0].day)}` : `${hit.length} days, last ${short(hit[hit.length - 1].day)}`}</div>}
    </div>
  );
}

export function ShadowReport({ session }: { session: Session }) {
  const periods = recentPeriods(new Date(), 6).slice(1); // before the current one ('')
  const [period, setPeriod] = useState('');
  const rep = useLoad(() => wouldBlock(session.org, period), [session.org, period]);
  const head = (
    <div class="page-head">
      <h1>Shadow and warn report</h1>
      <label class="inline-form">Period
        <select value={period} onChange={(e) => setPeriod((e.target as HTMLSelectElement).value)}>
          <option value="">Current period</option>
          {periods.map((p) => <option value={p}>{p}</option>)}
        </select>
      </label>
    </div>
  );
  if (rep.loading && !rep.data) return <>{head}<Loading what="the report" /></>;
  if (rep.error) return <>{head}<ErrorState error={rep.error} retry={rep.reload} /></>;
  const r = rep.data!;
  const days = periodDays(r.period_start, r.period_end);
  const peak = Math.max(1, ...r.rows.map((x) => x.checks));
  return (
    <>
      {head}
      <div class="panel">
        <p data-testid="report-summary">
          {r.mode === 'enforce'
            ? <><Id id={session.org} /> enforces its limits now; these are the checks that were let through while it was in shadow or warn mode. </>
            : <><Id id={session.org} /> is in <strong>{r.mode}</strong> mode: nothing is denied. </>}
          {r.checks > 0
            ? <>Enforcing would have denied <strong data-testid="report-checks">{formatNumber(r.checks)}</strong> checks
              ({formatNumber(r.units)} units) in {r.period}, at {formatNumber(r.rows.length)} {r.rows.length === 1 ? 'limit' : 'limits'}.</>
            : <>Nothing would have been denied in {r.period}.</>}
        </p>
        {r.capped && <p class="warning" role="note" data-testid="report-capped">More than 1,000 distinct limits would have blocked checks; the rest are counted together as “other limits”, so the totals stay exact.</p>}
        {r.checks > 0 && <><h2>Per day</h2><DayBars days={dayCounts(days, r.days)} label="Checks that would have been denied per day" testid="report-days" axis /></>}
      </div>
      {r.rows.length === 0 ? <Empty>No team or user would have been blocked in this period.</Empty> : (
        <div class="table-wrap panel">
          <table data-testid="report-rows">
            <caption>Who enforcing would block, most checks first</caption>
            <thead><tr><th scope="col">Limit</th><th scope="col">Checks enforce would deny</th><th class="num" scope="col">Units</th><th scope="col">Days</th></tr></thead>
            <tbody>
              {r.rows.map((x) => (
                <tr data-testid={`report-row-${x.level}-${x.team ? x.team + '-' : ''}${x.id ?? 'other'}-${x.metric ?? ''}-${x.window ?? ''}`}>
                  <th scope="row"><span class={`badge level-${x.level}`}>{x.level}</span> <RowHeading r={x} /></th>
                  <td class="wb-bar-cell">
                    <div class="usage-bar" data-level="over">
                      <div class="bar" role="progressbar" aria-label={rowLabel(x)} aria-valuemin={0} aria-valuemax={peak} aria-valuenow={x.checks}
                        aria-valuetext={`${formatNumber(x.checks)} checks`}>
                        <div class="bar-fill" style={{ width: `${(x.checks / peak) * 100}%` }} />
                      </div>
                    </div>
                    <span class="num" data-testid="row-checks">{formatNumber(x.checks)}</span>
                  </td>
                  <td class="num">{formatNumber(x.units)}</td>
                  <td><DayBars days={dayCounts(days, x.days)} label={`${rowLabel(x)} per day`} testid="row-days" /></td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </>
  );
}
