// The overview: the org's plan, mode and period, usage against limits, the period's
// pace and the teams and users that used the most.
import { EXHAUSTION_ORDER, sortRows, usageRows } from '../allocation';
import { api, ApiError, type Throttle, type Usage } from '../api';
import { AllocationTable } from './Allocation';
import { EntitlementsLink } from './Entitlements';
import { bucketText, currencies, currencyOf, dailySeries, formatAmount, formatBare, formatTime, periodOf, remainder, sortLimits, topByUsage, windowLabel } from '../format';
import { ThrottleBanner, throttledLimit } from '../throttle';
import { Empty, ErrorState, Id, IdText, Loading, PaceChart, UsageBar, useLoad } from '../ui';
import type { PageProps } from '../ui';

/** usageUnavailable tells whether the server has no usage API (yet). */
function usageUnavailable(e: unknown): boolean {
  return e instanceof ApiError && (e.status === 501 || e.status === 503);
}

export function Overview({ session }: PageProps) {
  const org = session.org;
  const data = useLoad(async () => {
    const [o, teams] = await Promise.all([api.org(org), api.teams(org)]);
    let usage: Usage | undefined;
    let usageError: unknown;
    try { usage = await api.usage(org); } catch (e) { usageError = e; }
    let throttle: Throttle | null = null; // the overview is shown without it if it cannot be read
    try { throttle = (await api.throttle(org)) ?? null; } catch { /* no banner */ }
    return { o, teams: teams.items, usage, usageError, throttle };
  }, [org]);
  if (data.loading && !data.data) return <Loading what="the overview" />;
  if (data.error) return <ErrorState error={data.error} retry={data.reload} />;
  const { o, teams, usage, usageError, throttle } = data.data!;
  const rem = remainder(o.effective_limits, teams);
  const metrics = [...new Set(o.effective_limits.map((l) => l.metric))].sort();
  const money = currencies(usage); // metric -> currency: spend is shown as money
  const now = new Date();
  return (
    <>
      <div class="page-head">
        <h1>Overview</h1>
        <button type="button" onClick={data.reload} disabled={data.loading}>{data.loading ? 'Refreshing…' : 'Refresh'}</button>
      </div>
      <div class="cards">
        <div class="card"><span class="card-label">Org</span><strong><IdText text={o.name} /></strong><span class="muted"><Id id={o.id} /></span></div>
        <div class="card"><span class="card-label">Plan</span><strong data-testid="plan"><Id id={o.plan} /></strong>
          <EntitlementsLink /></div>
        <div class="card"><span class="card-label">Mode</span><strong data-testid="mode" class={`mode mode-${o.mode}`}>{o.mode}</strong></div>
        <div class="card"><span class="card-label">Period</span><strong>{usage?.period ?? periodOf(now)}</strong>
          {usage && <span class="muted">until {formatTime(usage.period_end)}</span>}</div>
      </div>
      <ThrottleBanner throttle={throttle} now={now} />
      {usageError !== undefined && (
        <div class="notice" role="status" data-testid="usage-unavailable">
          {usageUnavailable(usageError)
            ? <>Usage is not available on this server yet ({(usageError as Error).message}). Limits and allocations are shown below.</>
            : <>Usage could not be loaded: {(usageError as Error).message}</>}
        </div>
      )}
      <section aria-labelledby="usage-h">
        <h2 id="usage-h">Usage against limits this period</h2>
        {metrics.length === 0 && <Empty>The plan sets no limits.</Empty>}
        <div class="metric-grid">
          {metrics.map((m) => {
            const mu = usage?.metrics.find((x) => x.metric === m);
            return (
              <div class="panel" data-testid={`metric-${m}`}>
                <h3>{m}</h3>
                {sortLimits(o.effective_limits.filter((l) => l.metric === m)).map((l) => {
                  const w = mu?.org.limits.find((x) => x.window === l.window);
                  const used = w?.used ?? (l.window === 'month' ? mu?.org.used ?? 0 : 0);
                  // A token bucket's bar is the tokens taken of its burst, what it holds.
                  if (l.burst) return <UsageBar label={bucketText(l, (n) => formatBare(n, currencyOf(mu)))} used={used} limit={w?.burst ?? l.burst} currency={currencyOf(mu)} />;
                  // Under a throttle the bar is against the limit checks apply now.
                  return <UsageBar label={windowLabel(l.window)} used={used} limit={throttledLimit(throttle, l.window, l.limit, now)} unthrottled={l.limit} currency={currencyOf(mu)} />;
                })}
                {!usage && <p class="muted small">Usage unknown: shown as 0.</p>}
              </div>
            );
          })}
        </div>
      </section>
      {usage && (
        <section aria-labelledby="pace-h">
          <h2 id="pace-h">Usage over the period</h2>
          {usage.metrics.length === 0 ? <Empty>Nothing used yet this period.</Empty> : (
            <div class="metric-grid">
              {usage.metrics.map((mu) => {
                const s = dailySeries(mu.daily ?? [], new Date(usage.period_start), new Date(usage.period_end), now);
                const lim = o.effective_limits.find((l) => l.metric === mu.metric && l.window === 'month')?.limit;
                const cur = currencyOf(mu); // spend: money
                return (
                  <div class="panel" data-testid={`history-${mu.metric}`}><h3>{mu.metric}</h3>
                    <p class="muted small">{formatAmount(mu.org.used, cur)} used so far{(mu.org.reserved ?? 0) > 0 ? `, ${formatAmount(mu.org.reserved ?? 0, cur)} reserved` : ''}{lim !== undefined ? ` of ${formatBare(lim, cur)} this month` : ''}.
                      {s.actual.length > 0 && <> The line is the org's total at the end of each day, and today's so far ({mu.daily!.length} {mu.daily!.length === 1 ? 'day' : 'days'} with usage recorded){s.projected.length > 0 ? '; the dashed line is a projection at the average pace so far' : ''}.</>}</p>
                    {s.actual.length === 0
                      ? <Empty>No daily history yet: the worker records the org's total at the end of each day as it saves usage.</Empty>
                      : <PaceChart metric={mu.metric} {...s} limit={lim} currency={cur} />}</div>
                );
              })}
            </div>
          )}
        </section>
      )}
      <section aria-labelledby="rem-h">
        <h2 id="rem-h">Unallocated remainder</h2>
        {rem.length === 0 ? <Empty>The org has no month limits to allocate.</Empty> : (
          <div class="table-wrap"><table data-testid="remainder">
            <thead><tr><th scope="col">Metric</th><th scope="col" class="num">Org month limit</th><th scope="col" class="num">Allocated to teams</th><th scope="col" class="num">Unallocated</th></tr></thead>
            <tbody>{rem.map((r) => (
              <tr><td>{r.metric}</td><td class="num">{formatAmount(r.limit, money[r.metric])}</td><td class="num">{formatAmount(r.allocated, money[r.metric])}</td>
                <td class={`num ${r.available < 0 ? 'over' : ''}`} data-testid={`remainder-${r.metric}`}>{formatAmount(r.available, money[r.metric])}</td></tr>))}
            </tbody></table></div>
        )}
      </section>
      {usage && (() => {
        const rows = sortRows(usageRows(usage, { start: new Date(usage.period_start), end: new Date(usage.period_end), now }), 'exhaustion')
          .filter((r) => r.used > 0).slice(0, 5);
        return (
          <section aria-labelledby="close-h">
            <h2 id="close-h">Closest to exhaustion</h2>
            <p class="muted small">{EXHAUSTION_ORDER}</p>
            {rows.length === 0 ? <Empty>No team or user has used any of its allocation yet.</Empty> : <AllocationTable rows={rows} testid="closest" money={money} />}
            <p class="small"><a href="/console/allocation">Every team and user against its allocation →</a></p>
          </section>
        );
      })()}
      {usage && (
        <section aria-labelledby="top-h" class="two-col">
          <div>
            <h2 id="top-h">Top teams</h2>
            <TopList usage={usage} kind="teams" />
          </div>
          <div>
            <h2>Top users</h2>
            <TopList usage={usage} kind="users" />
          </div>
        </section>
      )}
    </>
  );
}

function TopList({ usage, kind }: { usage: Usage; kind: 'teams' | 'users' }) {
  const rows = usage.metrics.flatMap((mu) => topByUsage(mu[kind], 5).map((l) => ({ metric: mu.metric, currency: currencyOf(mu), ...l })));
  if (rows.length === 0) return <Empty>No {kind === 'teams' ? 'team' : 'user'} has used anything this period.</Empty>;
  return (
    <div class="table-wrap"><table data-testid={`top-${kind}`}>
      <thead><tr><th scope="col">{kind === 'teams' ? 'Team' : 'User'}</th><th scope="col">Metric</th><th scope="col" class="num">Used</th><th scope="col" class="num">Reserved</th></tr></thead>
      <tbody>{rows.map((r) => <tr><td><Id id={r.id} />{r.team ? <span class="muted"> (<Id id={r.team} />)</span> : null}</td><td>{r.metric}</td><td class="num">{formatAmount(r.used, r.currency)}</td><td class="num">{formatAmount(r.reserved ?? 0, r.currency)}</td></tr>)}</tbody>
    </table></div>
  );
}
