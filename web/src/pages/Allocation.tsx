// The allocation: the org's quota carved into teams and users, edited in place.
import { useState } from 'preact/hooks';
import { allocationRows, EXHAUSTION_ORDER, forecastText, heldMatches, heldRows, inFlightRows, openCount, sortRows, type AllocRow, type Held, type InFlight, type OpenList, type SortKey } from '../allocation';
import { api, ApiError, type Org, type Reservation, type Team, type User } from '../api';
import { bucketText, currencies, expiresIn, formatAmount, formatBare, formatNumber, formatNumbersIn, idError, level, parseLimitIn, percent, remainder, type Remainder } from '../format';
import { errorFor, LimitsEditor } from '../limits';
import { Confirm, Empty, ErrorState, Id, IdText, Loading, MiniBar, useLoad, usePaged } from '../ui';
import type { PageProps } from '../ui';

export function Allocation({ session }: PageProps) {
  const org = session.org;
  const canEdit = session.role === 'admin';
  const data = useLoad(async () => {
    const [o, teams] = await Promise.all([api.org(org), api.teams(org)]);
    return { o, teams: teams.items };
  }, [org]);
  // Usage and every team's users come second: the teams show (and can be edited) first.
  const extra = useLoad(async () => {
    if (!data.data) return undefined;
    const [usage, lists, open] = await Promise.all([
      api.usage(org).catch(() => undefined), // shown without usage if it cannot be read
      Promise.all(data.data.teams.map((t) => api.users(org, t.id).then((p) => [t.id, p.items] as const))),
      loadOpen(org).catch(() => undefined), // the held panel then shows no counts
    ]);
    return { usage, users: Object.fromEntries(lists) as Record<string, User[]>, open };
  }, [org, data.data]);
  const [adding, setAdding] = useState(false);
  const [sort, setSort] = useState<SortKey>('exhaustion');
  if (data.loading && !data.data) return <Loading what="teams" />;
  if (data.error) return <ErrorState error={data.error} retry={data.reload} />;
  const { o, teams } = data.data!;
  const usage = extra.data?.usage;
  const rem = remainder(o.effective_limits, teams);
  const now = new Date();
  const period = usage ? { start: new Date(usage.period_start), end: new Date(usage.period_end), now } : undefined;
  const rows = period && extra.data ? sortRows(allocationRows(teams, extra.data.users, usage, period), sort) : [];
  return (
    <>
      <div class="page-head">
        <h1>Allocation</h1>
        {canEdit && !adding && <button type="button" class="primary" onClick={() => setAdding(true)}>Add team</button>}
      </div>
      <p class="muted">The org's month limits ({o.effective_limits.filter((l) => l.window === 'month').map((l) => `${l.metric} ${formatAmount(l.limit, currencies(usage)[l.metric])}`).join(', ') || 'none'})
        are carved into team allocations; users get their own or their team's defaults.</p>
      <section aria-labelledby="rem-h" class="metric-grid">
        <h2 id="rem-h" class="sr-only">Unallocated remainder</h2>
        {rem.map((r) => { const o = usage?.metrics.find((m) => m.metric === r.metric)?.org; return <RemainderPanel r={r} used={o?.used} reserved={o?.reserved} currency={currencies(usage)[r.metric]} />; })}
      </section>
      <section aria-labelledby="usage-h">
        <div class="page-head">
          <h2 id="usage-h">Used against allocated{usage ? <span class="muted small"> · {usage.period}</span> : null}</h2>
          <label class="inline">Sort by{' '}
            <select value={sort} onChange={(e) => setSort((e.target as HTMLSelectElement).value as SortKey)} data-testid="alloc-sort">
              <option value="exhaustion">closest to exhaustion</option>
              <option value="name">team and user</option>
            </select></label>
        </div>
        {sort === 'exhaustion' && <p class="muted small">{EXHAUSTION_ORDER}</p>}
        {extra.loading && !extra.data && <Loading what="usage" />}
        {extra.error !== undefined && <ErrorState error={extra.error} retry={extra.reload} />}
        {extra.data && !usage && <div class="notice" role="status">Usage could not be loaded: allocations are shown without it.</div>}
        {usage && rows.length === 0 && <Empty>No team or user has a limit yet.</Empty>}
        {rows.length > 0 && <AllocationTable rows={rows} money={currencies(usage)} />}
      </section>
      {usage && <HeldPanel org={org} held={heldRows(usage)} open={extra.data?.open} />}
      {usage && <InFlightPanel rows={inFlightRows(usage)} />}
      <h2>Teams and users</h2>
      {adding && <NewTeam org={org} money={currencies(usage)} onDone={(created) => { setAdding(false); if (created) data.reload(); }} />}
      {teams.length === 0 && <Empty>No teams yet.{canEdit ? ' Add one to allocate part of the org\'s quota.' : ''}</Empty>}
      {teams.map((t) => <TeamPanel key={t.id} org={o} team={t} canEdit={canEdit} money={currencies(usage)} onChange={data.reload} />)}
    </>
  );
}

/** RemainderPanel shows how much of the org's month limit of a metric the teams hold, and what is left. */
function RemainderPanel({ r, used, reserved = 0, currency }: { r: Remainder; used?: number; reserved?: number; currency?: string }) {
  const share = r.limit > 0 ? Math.min(100, (Math.max(0, r.allocated) / r.limit) * 100) : 100;
  const amt = (n: number) => formatAmount(n, currency); // money for spend, else units
  const bare = (n: number) => formatBare(n, currency);
  return (
    <div class="panel remainder" data-testid={`remainder-panel-${r.metric}`}>
      <h3>{r.metric} per month</h3>
      <div class="alloc-split" role="img" aria-label={`${amt(r.allocated)} of ${bare(r.limit)} allocated to teams, ${amt(r.available)} unallocated`}>
        <div class="alloc-teams" style={{ width: `${share}%` }} />
      </div>
      <dl class="facts small">
        <dt>Org limit</dt><dd class="num">{amt(r.limit)}</dd>
        <dt>Allocated to teams</dt><dd class="num">{amt(r.allocated)} ({percent(r.allocated, r.limit)})</dd>
        <dt>Unallocated</dt><dd class={`num ${r.available < 0 ? 'over' : ''}`}><strong data-testid={`alloc-remainder-${r.metric}`}>{amt(r.available)}</strong></dd>
        {used !== undefined && <><dt>Used by the org</dt><dd class="num" data-testid={`org-used-${r.metric}`}>{amt(used)} ({percent(used, r.limit)})</dd></>}
        {reserved > 0 && <><dt>Held by open reservations</dt><dd class="num" data-testid={`org-reserved-${r.metric}`}>{amt(reserved)} ({percent(reserved, r.limit)})</dd></>}
      </dl>
    </div>
  );
}

/** AllocationTable shows allocation rows: who, which limit, a bar of used against allocated, and the forecast. */
export function AllocationTable({ rows, testid = 'alloc-usage', money = {} }: { rows: AllocRow[]; testid?: string; money?: Record<string, string> }) {
  return (
    <div class="table-wrap"><table data-testid={testid} class="alloc-usage">
      <thead><tr><th scope="col">Team or user</th><th scope="col">Limit</th><th scope="col" class="bar-col">Used of allocated</th><th scope="col">At this pace</th></tr></thead>
      <tbody>{rows.map((r) => {
        const who = r.kind === 'team' ? r.id : `${r.team}/${r.id}`;
        const lv = level(r.used, r.limit);
        return (
          <tr data-level={lv} data-testid={`alloc-row-${r.kind}-${who}-${r.metric}-${r.window}`}>
            <td><span class={`badge kind-${r.kind}`}>{r.kind}</span> <Id id={r.id} before={r.kind === 'user' ? `${r.team}/` : undefined} />
              {!r.registered && <span class="muted small"> (no record: team defaults)</span>}</td>
            <td><span class="nowrap">{r.window === 'concurrent' ? `${r.metric} in flight` : r.burst ? `${r.metric} ${bucketText(r, (n) => formatAmount(n, money[r.metric]))}` : `${r.metric} per ${r.window}`}</span>{r.inherited && r.registered ? <span class="muted small"> (team default)</span> : null}</td>
            <td><MiniBar used={r.used} reserved={r.reserved} limit={r.burst ?? r.limit} label={`${who} ${r.metric} per ${r.window}${r.burst ? ' (tokens taken of the burst)' : ''}`} currency={money[r.metric]} /></td>
            <td class={`forecast forecast-${r.forecast?.kind ?? 'window'}`}>{r.window === 'concurrent' ? 'frees as holders settle' : forecastText(r.forecast)}
              {r.forecast?.kind === 'lasts' && <span class="muted small"> (about {formatAmount(r.forecast.projected, money[r.metric])} by its end)</span>}</td>
          </tr>
        );
      })}</tbody>
    </table></div>
  );
}

/** openPages is how many pages of 100 open reservations the held panel's counts read at most. */
const openPages = 10;

/** loadOpen reads the org's open reservations for the held panel's counts, up to openPages pages. */
async function loadOpen(org: string): Promise<OpenList> {
  const items: Reservation[] = [];
  let cursor: string | undefined;
  for (let i = 0; i < openPages; i++) {
    const p = await api.openReservations(org, { limit: 100, cursor });
    items.push(...p.items);
    if (!p.next_cursor) return { items, complete: true };
    cursor = p.next_cursor;
  }
  return { items, complete: false };
}

/**
 * HeldPanel lists the teams and users holding units in open reservations, the most
 * first, with how many reservations hold them; a row expands to list them.
 */
function HeldPanel({ org, held, open }: { org: string; held: Held[]; open?: OpenList }) {
  const [shown, setShown] = useState<string | null>(null);
  return (
    <section class="panel held" aria-labelledby="held-h" data-testid="held">
      <h2 id="held-h">Held by open reservations</h2>
      {held.length === 0 ? <p class="muted small">No team or user holds units in an open reservation.</p> : (
        <>
          <p class="muted small">Held units count against every limit as used units do until the reservation is committed, released or expires.</p>
          <div class="table-wrap"><table data-testid="held-rows">
            <thead><tr><th scope="col">Team or user</th><th scope="col">Metric</th><th scope="col" class="num">Held</th><th scope="col" class="num">Open reservations</th><th scope="col" class="num">Used</th></tr></thead>
            <tbody>{held.map((h) => {
              const who = h.kind === 'team' ? h.id : `${h.team}/${h.id}`;
              const key = `${h.kind}-${who}-${h.metric}`;
              const n = open ? openCount(h, open) : undefined;
              return (
                <>
                  <tr data-testid={`held-${key}`}>
                    <td><span class={`badge kind-${h.kind}`}>{h.kind}</span> <Id id={h.id} before={h.kind === 'user' ? `${h.team}/` : undefined} /></td>
                    <td>{h.metric}</td>
                    <td class="num"><strong data-testid="held-units">{formatNumber(h.reserved)}</strong></td>
                    <td class="num"><span data-testid="held-count">{n === undefined ? '—' : `${formatNumber(n)}${open && !open.complete ? '+' : ''}`}</span>{' '}
                      <button type="button" class="link small" aria-expanded={shown === key} data-testid="held-toggle"
                        onClick={() => setShown(shown === key ? null : key)}>{shown === key ? 'Hide' : 'Show'}</button></td>
                    <td class="num">{formatNumber(h.used)}</td>
                  </tr>
                  {shown === key && <tr class="held-open"><td colSpan={5}><OpenReservations org={org} held={h} /></td></tr>}
                </>
              );
            })}</tbody>
          </table></div>
        </>
      )}
    </section>
  );
}

/**
 * InFlightPanel shows, per level, the units held at once by open reservations against
 * concurrent limits (usage's in_flight), with the level's concurrent limit.
 */
export function InFlightPanel({ rows }: { rows: InFlight[] }) {
  if (rows.length === 0) return null;
  return (
    <section class="panel in-flight" aria-labelledby="inflight-h" data-testid="in-flight">
      <h2 id="inflight-h">In flight</h2>
      <p class="muted small">Units held at once by open reservations against concurrent limits; all of a reservation's units come back when it is committed, released or expires.</p>
      <div class="table-wrap"><table data-testid="in-flight-rows">
        <thead><tr><th scope="col">Level</th><th scope="col">Metric</th><th scope="col" class="bar-col">In flight of the concurrent limit</th></tr></thead>
        <tbody>{rows.map((r) => {
          const who = r.kind === 'user' ? `${r.team}/${r.id}` : r.id;
          return (
            <tr data-testid={`in-flight-${r.kind}-${who}-${r.metric}`}>
              <td><span class={`badge kind-${r.kind}`}>{r.kind}</span> <Id id={r.id} before={r.kind === 'user' ? `${r.team}/` : undefined} /></td>
              <td>{r.metric}</td>
              <td>{r.limit !== undefined
                ? <MiniBar used={r.inFlight} limit={r.limit} label={`${who} ${r.metric} in flight`} />
                : <><strong data-testid="in-flight-units">{formatNumber(r.inFlight)}</strong> <span class="muted small">(no concurrent limit of its own)</span></>}</td>
            </tr>
          );
        })}</tbody>
      </table></div>
    </section>
  );
}

/** OpenReservations lists the open reservations of a held row, soonest to expire first, a page at a time. */
function OpenReservations({ org, held }: { org: string; held: Held }) {
  const q = held.kind === 'team' ? { team: held.id } : { team: held.team, user: held.id };
  const list = usePaged((cursor) => api.openReservations(org, { ...q, limit: 50, cursor }), [org, held.kind, held.id, held.team]);
  if (list.loading && !list.loaded) return <Loading what="reservations" />;
  if (list.error) return <ErrorState error={list.error} retry={list.reload} />;
  const now = new Date();
  const items = list.items.filter((r) => heldMatches(held, r));
  return (
    <>
      {items.length === 0 && !list.hasMore ? <p class="muted small">No open reservation left: they were settled since the page loaded.</p> : (
        <div class="table-wrap"><table class="small" data-testid="open-reservations">
          <thead><tr><th scope="col">Id</th>{held.kind === 'team' && <th scope="col">User</th>}<th scope="col">Metric</th><th scope="col" class="num">Amount</th><th scope="col">Expires</th><th scope="col">On expiry</th></tr></thead>
          <tbody>{items.map((r) => (
            <tr data-testid={`open-${r.id}`}>
              <td><code>{r.id}</code></td>
              {held.kind === 'team' && <td>{r.user ?? <span class="muted">(team)</span>}</td>}
              <td>{r.metric}</td>
              <td class="num" data-testid="open-amount">{formatNumber(r.amount)}</td>
              <td data-testid="open-expires" title={r.expires_at}>{expiresIn(r.expires_at, now)}</td>
              <td data-testid="open-on-expiry">{r.on_expiry}</td>
            </tr>
          ))}</tbody>
        </table></div>
      )}
      {list.hasMore && <button type="button" class="link" disabled={list.loadingMore} onClick={() => void list.more()}>{list.loadingMore ? 'Loading…' : 'Load more'}</button>}
      {list.moreError !== undefined && <ErrorState error={list.moreError} retry={() => void list.more()} />}
    </>
  );
}

// A metric that is money (money maps it to its currency) has its limits typed as amounts, sent as micro-units.
export function NewTeam({ org, money, onDone }: { org: string; money: Record<string, string>; onDone: (created: boolean) => void }) {
  const [id, setId] = useState('');
  const [name, setName] = useState('');
  const [month, setMonth] = useState('');
  const [userMonth, setUserMonth] = useState('');
  const [metric, setMetric] = useState('requests');
  const [errors, setErrors] = useState<Record<string, string>>({});
  const [busy, setBusy] = useState(false);
  const currency = money[metric.trim()];
  const submit = async (e: Event) => {
    e.preventDefault();
    const errs: Record<string, string> = {};
    const idErr = idError(id.trim());
    if (idErr) errs.id = idErr;
    if (!name.trim()) errs.name = 'Enter a name.';
    const lim = month.trim() ? parseLimitIn(month, currency) : {};
    const ulim = userMonth.trim() ? parseLimitIn(userMonth, currency) : {};
    if (lim.error) errs['limits[0].limit'] = lim.error;
    if (ulim.error) errs['user_limits[0].limit'] = ulim.error;
    setErrors(errs);
    if (Object.keys(errs).length) return;
    setBusy(true);
    try {
      await api.createTeam(org, {
        id: id.trim(), name: name.trim(),
        limits: lim.value !== undefined ? [{ metric: metric.trim(), window: 'month', limit: lim.value }] : [],
        user_limits: ulim.value !== undefined ? [{ metric: metric.trim(), window: 'month', limit: ulim.value }] : [],
      });
      onDone(true);
    } catch (err) {
      const out: Record<string, string> = {};
      if (err instanceof ApiError && err.errors.length) for (const fe of err.errors) out[fe.field] = formatNumbersIn(fe.message);
      else out._ = errorFor(err, '');
      if (err instanceof ApiError && err.errors.length && !err.errors.some((fe) => ['id', 'name', 'limits[0].limit', 'user_limits[0].limit'].includes(fe.field))) out._ = formatNumbersIn(err.message);
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
  const inCur = currency ? ` (${currency})` : '';
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
        {field('limits[0].limit', `Month limit of the team${inCur}`, month, setMonth, currency ? 'optional, e.g. 500.00' : 'optional, e.g. 10k')}
        {field('user_limits[0].limit', `Month default per user${inCur}`, userMonth, setUserMonth, 'optional')}
      </div>
      {errors._ && <p class="field-error" role="alert">{errors._}</p>}
      <div class="actions">
        <button type="button" onClick={() => onDone(false)}>Cancel</button>
        <button type="submit" class="primary" disabled={busy}>Create team</button>
      </div>
    </form>
  );
}

// money maps the metrics that are money to their currency: their limits are edited as amounts.
function TeamPanel({ org, team, canEdit, money, onChange }: { org: Org; team: Team; canEdit: boolean; money: Record<string, string>; onChange: () => void }) {
  const [confirm, setConfirm] = useState(false);
  const users = useLoad(() => api.users(org.id, team.id).then((p) => p.items), [org.id, team.id]);
  const [newUser, setNewUser] = useState('');
  const [userError, setUserError] = useState<string>();
  return (
    <section class="panel team" aria-labelledby={`team-${team.id}`} data-testid={`team-${team.id}`}>
      <div class="page-head">
        <h2 id={`team-${team.id}`}><IdText text={team.name} /> <span class="muted">(<Id id={team.id} />)</span></h2>
        {canEdit && <button type="button" class="danger" onClick={() => setConfirm(true)}>Remove team</button>}
      </div>
      <div class="two-col">
        <LimitsEditor label={`Team ${team.id}`} idPrefix={`team-${team.id}`} list="limits" limits={team.limits} canEdit={canEdit} money={money}
          onSave={async (next) => { await api.patchTeam(org.id, team.id, { limits: next }); onChange(); }} />
        <LimitsEditor label={`User defaults of ${team.id}`} idPrefix={`team-${team.id}`} list="user_limits" limits={team.user_limits} canEdit={canEdit} money={money}
          onSave={async (next) => { await api.patchTeam(org.id, team.id, { user_limits: next }); onChange(); }} />
      </div>
      <h3>Users</h3>
      {users.loading && !users.data && <Loading what="users" />}
      {users.error !== undefined && <ErrorState error={users.error} retry={users.reload} />}
      {users.data && users.data.length === 0 && <Empty>No registered users: every user id gets the defaults above.</Empty>}
      {users.data?.map((u) => (
        <div class="user" data-testid={`user-${team.id}-${u.id}`}>
          <LimitsEditor label={`User ${u.id}`} idPrefix={`user-${team.id}-${u.id}`} list="limits" limits={u.limits} canEdit={canEdit} money={money}
            defaults={{ limits: team.user_limits, from: `the user defaults of ${team.id}` }}
            onSave={async (next) => { await api.patchUser(org.id, team.id, u.id, { limits: next }); users.reload(); onChange(); }} />
          {canEdit && <button type="button" class="danger small" onClick={async () => {
            try { await api.deleteUser(org.id, team.id, u.id); users.reload(); onChange(); } catch (e) { setUserError(errorFor(e, '')); }
          }}>Remove user <Id id={u.id} /></button>}
        </div>
      ))}
      {canEdit && (
        <form class="inline-form" onSubmit={async (e) => {
          e.preventDefault();
          const err = idError(newUser.trim());
          if (err) { setUserError(err); return; }
          try { await api.createUser(org.id, team.id, { id: newUser.trim(), limits: [] }); setNewUser(''); setUserError(undefined); users.reload(); onChange(); }
          catch (e2) { setUserError(errorFor(e2, 'id')); }
        }}>
          <label for={`new-user-${team.id}`}>Add user to <Id id={team.id} /></label>
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
