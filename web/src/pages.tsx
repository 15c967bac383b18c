// The console's pages. Each loads what it shows through the /v1 API.
import { useState } from 'preact/hooks';
import { api, ApiError, MODES, type APIKey, type AuditEntry, type Mode, type NewKey, type Org, type Scope, type Session, type Team, type Throttle, type Usage, type Webhook, type WebhookDelivery } from './api';
import { dailySeries, formatNumber, formatTime, idError, parseLimit, periodOf, recentPeriods, remainder, sortLimits, topByUsage, windowLabel } from './format';
import { errorFor, LimitsEditor } from './limits';
import { ThrottleBanner } from './throttle';
import { Confirm, Empty, ErrorState, Loading, PaceChart, UsageBar, useLoad } from './ui';

type Props = { session: Session };

/** usageUnavailable tells whether the server has no usage API (yet). */
function usageUnavailable(e: unknown): boolean {
  return e instanceof ApiError && (e.status === 501 || e.status === 503);
}

export function Overview({ session }: Props) {
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
  const now = new Date();
  return (
    <>
      <div class="page-head">
        <h1>Overview</h1>
        <button type="button" onClick={data.reload} disabled={data.loading}>{data.loading ? 'Refreshing…' : 'Refresh'}</button>
      </div>
      <div class="cards">
        <div class="card"><span class="card-label">Org</span><strong>{o.name}</strong><span class="muted">{o.id}</span></div>
        <div class="card"><span class="card-label">Plan</span><strong data-testid="plan">{o.plan}</strong></div>
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
                  return <UsageBar label={windowLabel(l.window)} used={used} limit={l.limit} />;
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
                return (
                  <div class="panel" data-testid={`history-${mu.metric}`}><h3>{mu.metric}</h3>
                    <p class="muted small">{formatNumber(mu.org.used)} used so far{(mu.org.reserved ?? 0) > 0 ? `, ${formatNumber(mu.org.reserved ?? 0)} reserved` : ''}{lim !== undefined ? ` of ${formatNumber(lim)} this month` : ''}.
                      {s.actual.length > 0 && <> The line is the org's total at the end of each day, and today's so far ({mu.daily!.length} {mu.daily!.length === 1 ? 'day' : 'days'} with usage recorded){s.projected.length > 0 ? '; the dashed line is a projection at the average pace so far' : ''}.</>}</p>
                    {s.actual.length === 0
                      ? <Empty>No daily history yet: the worker records the org's total at the end of each day as it saves usage.</Empty>
                      : <PaceChart metric={mu.metric} {...s} limit={lim} />}</div>
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
              <tr><td>{r.metric}</td><td class="num">{formatNumber(r.limit)}</td><td class="num">{formatNumber(r.allocated)}</td>
                <td class={`num ${r.available < 0 ? 'over' : ''}`} data-testid={`remainder-${r.metric}`}>{formatNumber(r.available)}</td></tr>))}
            </tbody></table></div>
        )}
      </section>
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
  const rows = usage.metrics.flatMap((mu) => topByUsage(mu[kind], 5).map((l) => ({ metric: mu.metric, ...l })));
  if (rows.length === 0) return <Empty>No {kind === 'teams' ? 'team' : 'user'} has used anything this period.</Empty>;
  return (
    <div class="table-wrap"><table data-testid={`top-${kind}`}>
      <thead><tr><th scope="col">{kind === 'teams' ? 'Team' : 'User'}</th><th scope="col">Metric</th><th scope="col" class="num">Used</th><th scope="col" class="num">Reserved</th></tr></thead>
      <tbody>{rows.map((r) => <tr><td>{r.id}{r.team ? <span class="muted"> ({r.team})</span> : null}</td><td>{r.metric}</td><td class="num">{formatNumber(r.used)}</td><td class="num">{formatNumber(r.reserved ?? 0)}</td></tr>)}</tbody>
    </table></div>
  );
}

export function Allocation({ session }: Props) {
  const org = session.org;
  const canEdit = session.role === 'admin';
  const data = useLoad(async () => {
    const [o, teams] = await Promise.all([api.org(org), api.teams(org)]);
    return { o, teams: teams.items };
  }, [org]);
  const [adding, setAdding] = useState(false);
  if (data.loading && !data.data) return <Loading what="teams" />;
  if (data.error) return <ErrorState error={data.error} retry={data.reload} />;
  const { o, teams } = data.data!;
  const rem = remainder(o.effective_limits, teams);
  return (
    <>
      <div class="page-head">
        <h1>Allocation</h1>
        {canEdit && !adding && <button type="button" class="primary" onClick={() => setAdding(true)}>Add team</button>}
      </div>
      <p class="muted">The org's month limits ({o.effective_limits.filter((l) => l.window === 'month').map((l) => `${l.metric} ${formatNumber(l.limit)}`).join(', ') || 'none'})
        are carved into team allocations; users get their own or their team's defaults.
        {rem.map((r) => <> Unallocated {r.metric}: <strong data-testid={`alloc-remainder-${r.metric}`}>{formatNumber(r.available)}</strong>.</>)}</p>
      {adding && <NewTeam org={org} onDone={(created) => { setAdding(false); if (created) data.reload(); }} />}
      {teams.length === 0 && <Empty>No teams yet.{canEdit ? ' Add one to allocate part of the org\'s quota.' : ''}</Empty>}
      {teams.map((t) => <TeamPanel key={t.id} org={o} team={t} canEdit={canEdit} onChange={data.reload} />)}
    </>
  );
}

function NewTeam({ org, onDone }: { org: string; onDone: (created: boolean) => void }) {
  const [id, setId] = useState('');
  const [name, setName] = useState('');
  const [month, setMonth] = useState('');
  const [userMonth, setUserMonth] = useState('');
  const [metric, setMetric] = useState('requests');
  const [errors, setErrors] = useState<Record<string, string>>({});
  const [busy, setBusy] = useState(false);
  const submit = async (e: Event) => {
    e.preventDefault();
    const errs: Record<string, string> = {};
    const idErr = idError(id.trim());
    if (idErr) errs.id = idErr;
    if (!name.trim()) errs.name = 'Enter a name.';
    const lim = month.trim() ? parseLimit(month) : {};
    const ulim = userMonth.trim() ? parseLimit(userMonth) : {};
    if (lim.error) errs['limits[0].limit'] = lim.error;
    if (ulim.error) errs['user_limits[0].limit'] = ulim.error;
    setErrors(errs);
    if (Object.keys(errs).length) return;
    setBusy(true);
    try {
      await api.createTeam(org, {
        id: id.trim(), name: name.trim(),
        limits: lim.value !== undefined ? [{ metric, window: 'month', limit: lim.value }] : [],
        user_limits: ulim.value !== undefined ? [{ metric, window: 'month', limit: ulim.value }] : [],
      });
      onDone(true);
    } catch (err) {
      const out: Record<string, string> = {};
      if (err instanceof ApiError && err.errors.length) for (const fe of err.errors) out[fe.field] = fe.message;
      else out._ = errorFor(err, '');
      if (err instanceof ApiError && err.errors.length && !err.errors.some((fe) => ['id', 'name', 'limits[0].limit', 'user_limits[0].limit'].includes(fe.field))) out._ = err.message;
      setErrors(out);
      setBusy(false);
    }
  };
  const field = (key: string, label: string, value: string, set: (v: string) => void, hint?: string) => (
    <div class="field">
      <label for={`new-team-${key}`}>{label}</label>
      <input id={`new-team-${key}`} name={key} value={value} onInput={(e) => set((e.target as HTMLInputElement).value)}
        aria-invalid={errors[key] ? 'true' : undefined} aria-describedby={errors[key] ? `new-team-${key}-error` : undefined} placeholder={hint} />
      {errors[key] && <p id={`new-team-${key}-error`} class="field-error" role="alert">{errors[key]}</p>}
    </div>
  );
  return (
    <form class="panel new-team" onSubmit={submit} aria-labelledby="new-team-h">
      <h2 id="new-team-h">New team</h2>
      <div class="form-grid">
        {field('id', 'Team id', id, setId, 'e.g. ml')}
        {field('name', 'Name', name, setName, 'e.g. Machine learning')}
        <div class="field">
          <label for="new-team-metric">Metric</label>
          <input id="new-team-metric" name="metric" value={metric} onInput={(e) => setMetric((e.target as HTMLInputElement).value)} />
        </div>
        {field('limits[0].limit', 'Month limit of the team', month, setMonth, 'optional, e.g. 10k')}
        {field('user_limits[0].limit', 'Month default per user', userMonth, setUserMonth, 'optional')}
      </div>
      {errors._ && <p class="field-error" role="alert">{errors._}</p>}
      <div class="actions">
        <button type="button" onClick={() => onDone(false)}>Cancel</button>
        <button type="submit" class="primary" disabled={busy}>Create team</button>
      </div>
    </form>
  );
}

function TeamPanel({ org, team, canEdit, onChange }: { org: Org; team: Team; canEdit: boolean; onChange: () => void }) {
  const [confirm, setConfirm] = useState(false);
  const users = useLoad(() => api.users(org.id, team.id).then((p) => p.items), [org.id, team.id]);
  const [newUser, setNewUser] = useState('');
  const [userError, setUserError] = useState<string>();
  return (
    <section class="panel team" aria-labelledby={`team-${team.id}`} data-testid={`team-${team.id}`}>
      <div class="page-head">
        <h2 id={`team-${team.id}`}>{team.name} <span class="muted">({team.id})</span></h2>
        {canEdit && <button type="button" class="danger" onClick={() => setConfirm(true)}>Remove team</button>}
      </div>
      <div class="two-col">
        <LimitsEditor label={`Team ${team.id}`} idPrefix={`team-${team.id}`} list="limits" limits={team.limits} canEdit={canEdit}
          onSave={async (next) => { await api.patchTeam(org.id, team.id, { limits: next }); onChange(); }} />
        <LimitsEditor label={`User defaults of ${team.id}`} idPrefix={`team-${team.id}`} list="user_limits" limits={team.user_limits} canEdit={canEdit}
          onSave={async (next) => { await api.patchTeam(org.id, team.id, { user_limits: next }); onChange(); }} />
      </div>
      <h3>Users</h3>
      {users.loading && !users.data && <Loading what="users" />}
      {users.error !== undefined && <ErrorState error={users.error} retry={users.reload} />}
      {users.data && users.data.length === 0 && <Empty>No registered users: every user id gets the defaults above.</Empty>}
      {users.data?.map((u) => (
        <div class="user" data-testid={`user-${team.id}-${u.id}`}>
          <LimitsEditor label={`User ${u.id}`} idPrefix={`user-${team.id}-${u.id}`} list="limits" limits={u.limits} canEdit={canEdit}
            onSave={async (next) => { await api.patchUser(org.id, team.id, u.id, { limits: next }); users.reload(); }} />
          {canEdit && <button type="button" class="danger small" onClick={async () => {
            try { await api.deleteUser(org.id, team.id, u.id); users.reload(); } catch (e) { setUserError(errorFor(e, '')); }
          }}>Remove user {u.id}</button>}
        </div>
      ))}
      {canEdit && (
        <form class="inline-form" onSubmit={async (e) => {
          e.preventDefault();
          const err = idError(newUser.trim());
          if (err) { setUserError(err); return; }
          try { await api.createUser(org.id, team.id, { id: newUser.trim(), limits: [] }); setNewUser(''); setUserError(undefined); users.reload(); }
          catch (e2) { setUserError(errorFor(e2, 'id')); }
        }}>
          <label for={`new-user-${team.id}`}>Add user to {team.id}</label>
          <input id={`new-user-${team.id}`} value={newUser} placeholder="user id" onInput={(e) => setNewUser((e.target as HTMLInputElement).value)}
            aria-invalid={userError ? 'true' : undefined} />
          <button type="submit">Add user</button>
          {userError && <p class="field-error" role="alert">{userError}</p>}
        </form>
      )}
      {confirm && <Confirm title={`Remove team ${team.id}?`} danger confirmLabel="Remove team"
        body={<p>The team's allocation returns to the org. Its users and their allocations are removed too.</p>}
        onConfirm={async () => { await api.deleteTeam(org.id, team.id); onChange(); }} onClose={() => setConfirm(false)} />}
    </section>
  );
}

const ALL_SCOPES: Scope[] = ['check', 'admin', 'billing'];

export function Keys({ session }: Props) {
  const org = session.org;
  const canEdit = session.role === 'admin';
  const keys = useLoad(() => api.keys(org).then((p) => p.items), [org]);
  const [name, setName] = useState('');
  const [scopes, setScopes] = useState<Scope[]>(['check']);
  const [created, setCreated] = useState<NewKey>();
  const [error, setError] = useState<string>();
  const [revoke, setRevoke] = useState<APIKey>();
  const [copied, setCopied] = useState('');
  return (
    <>
      <div class="page-head"><h1>API keys</h1></div>
      {canEdit && (
        <form class="panel" aria-labelledby="new-key-h" onSubmit={async (e) => {
          e.preventDefault();
          if (!name.trim()) { setError('Enter a name for the key.'); return; }
          if (scopes.length === 0) { setError('Pick at least one scope.'); return; }
          try { setCreated(await api.createKey(org, name.trim(), scopes)); setName(''); setError(undefined); setCopied(''); keys.reload(); }
          catch (err) { setError(errorFor(err, 'name')); }
        }}>
          <h2 id="new-key-h">Create a key</h2>
          <div class="form-grid">
            <div class="field"><label for="key-name">Name</label>
              <input id="key-name" value={name} placeholder="e.g. checkout-service" onInput={(e) => setName((e.target as HTMLInputElement).value)} /></div>
            <fieldset class="field"><legend>Scopes</legend>
              {ALL_SCOPES.map((s) => (
                <label class="check"><input type="checkbox" name="scope" value={s} checked={scopes.includes(s)}
                  onChange={(e) => setScopes((e.target as HTMLInputElement).checked ? [...scopes, s] : scopes.filter((x) => x !== s))} /> {s}</label>
              ))}
            </fieldset>
          </div>
          {error && <p class="field-error" role="alert">{error}</p>}
          <div class="actions"><button type="submit" class="primary">Create key</button></div>
        </form>
      )}
      {created && (
        <div class="panel secret" role="status" data-testid="new-key">
          <h2>Key “{created.name}” created</h2>
          <p>Copy the secret now: it is shown only once.</p>
          <div class="secret-row">
            <code data-testid="key-secret">{created.secret}</code>
            <button type="button" class="primary" onClick={async () => {
              try { await navigator.clipboard.writeText(created.secret); setCopied('Copied.'); }
              catch { setCopied('Copying is not allowed here: select the secret and copy it.'); }
            }}>Copy</button>
            <button type="button" onClick={() => setCreated(undefined)}>Done</button>
          </div>
          {copied && <p class="muted" aria-live="polite">{copied}</p>}
        </div>
      )}
      {keys.loading && !keys.data && <Loading what="keys" />}
      {keys.error !== undefined && <ErrorState error={keys.error} retry={keys.reload} />}
      {keys.data && keys.data.length === 0 && <Empty>No keys yet.</Empty>}
      {keys.data && keys.data.length > 0 && (
        <div class="table-wrap"><table data-testid="keys">
          <thead><tr><th scope="col">Name</th><th scope="col">Prefix</th><th scope="col">Scopes</th><th scope="col">Created</th><th scope="col">Last used</th><th scope="col">Status</th>{canEdit && <th scope="col"><span class="sr-only">Actions</span></th>}</tr></thead>
          <tbody>{keys.data.map((k) => (
            <tr><td>{k.name}</td><td><code>{k.prefix}</code></td><td>{k.scopes.join(', ')}</td><td>{formatTime(k.created_at)}</td><td>{formatTime(k.last_used_at)}</td>
              <td>{k.revoked_at ? <span class="badge revoked">revoked</span> : <span class="badge">active</span>}</td>
              {canEdit && <td>{!k.revoked_at && <button type="button" class="danger small" onClick={() => setRevoke(k)}>Revoke</button>}</td>}</tr>
          ))}</tbody>
        </table></div>
      )}
      {revoke && <Confirm title={`Revoke key “${revoke.name}”?`} danger confirmLabel="Revoke key"
        body={<p>Services using it get 401 at once. This cannot be undone.</p>}
        onConfirm={async () => { await api.revokeKey(org, revoke.id); keys.reload(); }} onClose={() => setRevoke(undefined)} />}
    </>
  );
}

export function Audit({ session }: Props) {
  const org = session.org;
  const [pages, setPages] = useState<AuditEntry[][]>([]);
  const [cursor, setCursor] = useState<string | null>(null);
  const first = useLoad(async () => {
    const p = await api.audit(org);
    setPages([p.items]);
    setCursor(p.next_cursor);
    return p;
  }, [org]);
  const [moreError, setMoreError] = useState<unknown>();
  const entries = pages.flat();
  if (first.loading && !first.data) return <Loading what="the audit log" />;
  if (first.error) return <ErrorState error={first.error} retry={first.reload} />;
  return (
    <>
      <div class="page-head"><h1>Audit log</h1><button type="button" onClick={first.reload}>Refresh</button></div>
      {entries.length === 0 && <Empty>No changes recorded yet.</Empty>}
      {entries.length > 0 && (
        <div class="table-wrap"><table data-testid="audit">
          <thead><tr><th scope="col">Time</th><th scope="col">Actor</th><th scope="col">Action</th><th scope="col">Object</th><th scope="col">Change</th></tr></thead>
          <tbody>{entries.map((e) => (
            <tr><td>{formatTime(e.time ?? e.at)}</td><td>{e.actor}</td><td>{e.action}</td><td>{e.object}</td>
              <td><details><summary>before / after</summary><pre>{JSON.stringify({ before: e.before, after: e.after }, null, 2)}</pre></details></td></tr>
          ))}</tbody>
        </table></div>
      )}
      {moreError !== undefined && <ErrorState error={moreError} />}
      {cursor && <button type="button" onClick={async () => {
        try { const p = await api.audit(org, cursor); setPages([...pages, p.items]); setCursor(p.next_cursor); } catch (e) { setMoreError(e); }
      }}>Load older changes</button>}
    </>
  );
}

export function Billing({ session }: Props) {
  const periods = recentPeriods(new Date(), 12);
  const [period, setPeriod] = useState(periods[0]);
  const [format, setFormat] = useState<'csv' | 'json'>('csv');
  const url = api.exportURL(session.org, period, format);
  return (
    <>
      <div class="page-head"><h1>Billing export</h1></div>
      <div class="panel">
        <p>One row per team, user and metric with the units used in the period, plus the org's totals with included units, overage and amount.</p>
        <div class="form-grid">
          <div class="field"><label for="period">Period</label>
            <select id="period" value={period} onChange={(e) => setPeriod((e.target as HTMLSelectElement).value)}>
              {periods.map((p, i) => <option value={p}>{p}{i === 0 ? ' (current)' : ''}</option>)}
            </select></div>
          <fieldset class="field"><legend>Format</legend>
            <label class="check"><input type="radio" name="format" value="csv" checked={format === 'csv'} onChange={() => setFormat('csv')} /> CSV</label>
            <label class="check"><input type="radio" name="format" value="json" checked={format === 'json'} onChange={() => setFormat('json')} /> JSON</label>
          </fieldset>
        </div>
        <div class="actions"><a class="button primary" href={url} download={`quotaplane-${session.org}-${period}.${format}`} data-testid="download">Download {format.toUpperCase()}</a></div>
      </div>
    </>
  );
}

export function Webhooks({ session }: Props) {
  const org = session.org;
  const hook = useLoad(() => api.webhook(org), [org]);
  const [pages, setPages] = useState<WebhookDelivery[][]>([]);
  const [cursor, setCursor] = useState<string | null>(null);
  const first = useLoad(async () => {
    const p = await api.webhookDeliveries(org);
    setPages([p.items]);
    setCursor(p.next_cursor);
    return p;
  }, [org]);
  const [moreError, setMoreError] = useState<unknown>();
  const deliveries = pages.flat();
  return (
    <>
      <div class="page-head"><h1>Webhooks</h1>
        <button type="button" onClick={() => { hook.reload(); first.reload(); }}>Refresh</button></div>
      {hook.loading && !hook.data && <Loading what="the webhook settings" />}
      {hook.error !== undefined && <ErrorState error={hook.error} retry={hook.reload} />}
      {hook.data && <WebhookSettings hook={hook.data} />}
      <h2>Recent deliveries</h2>
      {first.loading && !first.data && <Loading what="the delivery log" />}
      {first.error !== undefined && <ErrorState error={first.error} retry={first.reload} />}
      {first.data && deliveries.length === 0 && <Empty>No deliveries yet. Every attempt to send an event appears here, failed ones too.</Empty>}
      {deliveries.length > 0 && (
        <div class="table-wrap"><table data-testid="deliveries">
          <thead><tr><th scope="col">Time</th><th scope="col">Event</th><th scope="col" class="num">Attempt</th><th scope="col">Result</th><th scope="col">URL</th></tr></thead>
          <tbody>{deliveries.map((d) => (
            <tr><td>{formatTime(d.at)}</td><td>{d.event} <span class="muted">#{d.event_id}</span></td><td class="num">{d.attempt}</td>
              <td>{d.succeeded ? <span class="badge">{d.status_code ?? 'ok'}</span> : <span class="badge revoked">{d.status_code ?? 'failed'}</span>}
                {d.error && <span class="muted small"> {d.error}</span>}</td>
              <td class="break">{d.url}</td></tr>
          ))}</tbody>
        </table></div>
      )}
      {moreError !== undefined && <ErrorState error={moreError} />}
      {cursor && <button type="button" onClick={async () => {
        try { const p = await api.webhookDeliveries(org, cursor); setPages([...pages, p.items]); setCursor(p.next_cursor); } catch (e) { setMoreError(e); }
      }}>Load older deliveries</button>}
    </>
  );
}

function WebhookSettings({ hook }: { hook: Webhook }) {
  const [shown, setShown] = useState(false);
  const [copied, setCopied] = useState('');
  const secret = hook.signing_secret;
  return (
    <div class="panel" data-testid="webhook">
      <dl class="facts">
        <dt>URL</dt>
        <dd data-testid="webhook-url">{hook.url ? <code class="break">{hook.url}</code> : <span class="muted">No webhook URL is set: events are recorded but not sent.</span>}
          {hook.url_warning && <p class="warning small" role="note" data-testid="webhook-url-warning">{hook.url_warning}</p>}</dd>
        <dt>Events</dt><dd>{hook.events.join(', ')}</dd>
        <dt>Signing secret</dt>
        <dd>{secret ? (
          <div class="secret-row">
            <code data-testid="webhook-secret" class="break">{shown ? secret : '•'.repeat(16)}</code>
            <button type="button" onClick={() => setShown(!shown)} aria-pressed={shown}>{shown ? 'Hide' : 'Show'}</button>
            <button type="button" class="primary" onClick={async () => {
              try { await navigator.clipboard.writeText(secret); setCopied('Copied.'); }
              catch { setCopied('Copying is not allowed here: show the secret, select it and copy it.'); }
            }}>Copy secret</button>
            {copied && <span class="muted" aria-live="polite">{copied}</span>}
          </div>
        ) : <span class="muted" data-testid="webhook-note">{hook.note ?? 'No signing secret.'}</span>}</dd>
      </dl>
      <p class="muted small">Each delivery is a JSON POST with <code>{hook.signature_header}: t=&lt;unix&gt;,v1=&lt;hex&gt;</code>.
        To verify it, compute HMAC-SHA256 of <code>&lt;t&gt;.&lt;raw body&gt;</code> with the secret as the key, compare it
        with <code>v1</code> in constant time, and refuse an old <code>t</code>; in Go, <code>webhook.Verify</code> of
        {' '}<code>github.com/quotaplane/quotaplane/webhook</code> does it. Failed deliveries are retried with backoff.</p>
    </div>
  );
}

const MODE_HELP: Record<Mode, string> = {
  enforce: 'Checks over a limit are denied with 429.',
  shadow: 'Nothing is denied; answers report what would have been blocked.',
  warn: 'Nothing is denied; answers over a limit carry a warning header.',
};

export function Settings({ session }: Props) {
  const org = useLoad(() => api.org(session.org), [session.org]);
  const [pick, setPick] = useState<Mode>();
  const canEdit = session.role === 'admin';
  if (org.loading && !org.data) return <Loading what="the org" />;
  if (org.error) return <ErrorState error={org.error} retry={org.reload} />;
  const o = org.data!;
  return (
    <>
      <div class="page-head"><h1>Enforcement mode</h1></div>
      <div class="panel">
        <p>Current mode: <strong data-testid="current-mode">{o.mode}</strong>. {MODE_HELP[o.mode]} All modes count usage.</p>
        {canEdit ? (
          <fieldset><legend>Switch the mode</legend>
            {MODES.map((m) => (
              <div class="mode-choice">
                <button type="button" disabled={m === o.mode} aria-pressed={m === o.mode} onClick={() => setPick(m)}>
                  {m === o.mode ? `${m} (current)` : `Switch to ${m}`}</button>
                <span class="muted">{MODE_HELP[m]}</span>
              </div>
            ))}
          </fieldset>
        ) : <p class="muted">Viewers cannot change the mode.</p>}
      </div>
      {pick && <Confirm title={`Switch ${o.id} to ${pick}?`} confirmLabel={`Switch to ${pick}`} danger={pick !== 'enforce'}
        body={<p>{MODE_HELP[pick]} Every API replica applies it within a second.</p>}
        onConfirm={async () => { await api.setMode(o.id, pick); org.reload(); }} onClose={() => setPick(undefined)} />}
    </>
  );
}
