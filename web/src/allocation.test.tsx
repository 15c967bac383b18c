import { describe, expect, it } from 'vitest';
import { render } from 'preact';
import { act } from 'preact/test-utils';
import { allocationRows, forecast, forecastText, formatDay, heldMatches, heldRows, inFlightRows, mergeLimits, openCount, sortRows, usageRows, type AllocRow, type Held } from './allocation';
import type { Reservation, Team, Usage, User, Window } from './api';
import { level } from './format';
import { MiniBar } from './ui';

const start = new Date('2026-11-01T00:00:00Z');
const end = new Date('2026-12-01T00:00:00Z');
const now = new Date('2026-11-11T00:00:00Z'); // a third of the period

describe('forecast', () => {
  it('runs out where the pace so far meets the limit', () => {
    // 400 in 10 days is 40 a day: the other 600 of 1,000 take 15 more days.
    const f = forecast(400, 1000, start, end, now);
    expect(f).toEqual({ kind: 'runs-out', at: new Date('2026-11-26T00:00:00Z') });
    expect(forecastText(f)).toBe('runs out on 26 Nov');
  });
  it('lasts the period when the pace does not reach the limit, and says the projected use', () => {
    expect(forecast(100, 1000, start, end, now)).toEqual({ kind: 'lasts', projected: 300 });
  });
  it('reaching the limit exactly at the end still lasts', () => {
    expect(forecast(300, 900, start, end, now).kind).toBe('lasts');
  });
  it('is used up at or over the limit', () => {
    expect(forecast(1000, 1000, start, end, now)).toEqual({ kind: 'exhausted' });
    expect(forecast(1200, 1000, start, end, now)).toEqual({ kind: 'exhausted' });
    expect(forecastText({ kind: 'exhausted' })).toBe('used up');
  });
  it('has no pace without usage or before the period starts', () => {
    expect(forecast(0, 1000, start, end, now)).toEqual({ kind: 'idle' });
    expect(forecast(0, 0, start, end, now)).toEqual({ kind: 'idle' });
    expect(forecast(5, 1000, start, end, start)).toEqual({ kind: 'idle' });
  });
  it('formats days in UTC', () => {
    expect(formatDay(new Date('2026-11-28T23:30:00Z'))).toBe('28 Nov');
    expect(formatDay(new Date('2026-12-01T00:10:00Z'))).toBe('1 Dec');
  });
});

describe('allocation rows', () => {
  const teams: Team[] = [
    { id: 'eng', org: 'acme', name: 'Engineering', limits: [{ metric: 'requests', window: 'month', limit: 60000 }],
      user_limits: [{ metric: 'requests', window: 'month', limit: 5000 }, { metric: 'requests', window: 'minute', limit: 10 }], created_at: '', updated_at: '' },
    { id: 'sales', org: 'acme', name: 'Sales', limits: [{ metric: 'requests', window: 'month', limit: 20000 }], user_limits: [], created_at: '', updated_at: '' },
  ];
  const users: Record<string, User[]> = {
    eng: [
      { id: 'alice', org: 'acme', team: 'eng', limits: [{ metric: 'requests', window: 'month', limit: 8000 }], created_at: '', updated_at: '' },
      { id: 'dave', org: 'acme', team: 'eng', limits: [], created_at: '', updated_at: '' },
    ],
  };
  const usage: Usage = {
    org: 'acme', period: '2026-11', period_start: start.toISOString(), period_end: end.toISOString(),
    metrics: [{
      metric: 'requests', daily: [],
      org: { id: 'acme', used: 24000, reserved: 0, limits: [] },
      teams: [{ id: 'eng', used: 23000, reserved: 0, limits: [{ window: 'month', limit: 60000, used: 23000, remaining: 37000 }] },
        { id: 'sales', used: 1000, reserved: 0, limits: [{ window: 'month', limit: 20000, used: 1000, remaining: 19000 }] }],
      users: [{ id: 'alice', team: 'eng', used: 7000, reserved: 0, limits: [{ window: 'month', limit: 8000, used: 7000, remaining: 1000 }, { window: 'minute', limit: 10, used: 2, remaining: 8 }] },
        { id: 'carol', team: 'eng', used: 5000, reserved: 0, limits: [{ window: 'month', limit: 5000, used: 5000, remaining: 0 }] }],
    }],
  };
  const rows = allocationRows(teams, users, usage, { start, end, now });

  it('mergeLimits overrides the defaults per metric and window', () => {
    expect(mergeLimits(teams[0].user_limits, users.eng[0].limits)).toEqual([
      { metric: 'requests', window: 'month', limit: 8000 }, { metric: 'requests', window: 'minute', limit: 10 }]);
  });

  it('lists every team and user, registered or not (with the limits the API applied), with used against allocated', () => {
    const brief = rows.map((r) => `${r.kind} ${r.team ? r.team + '/' : ''}${r.id} ${r.window} ${r.used}/${r.limit}${r.inherited ? ' (default)' : ''}${r.registered ? '' : ' (unregistered)'}`);
    expect(brief).toEqual([
      'team eng month 23000/60000',
      'user eng/alice month 7000/8000',
      'user eng/alice minute 2/10 (default)',
      'user eng/dave month 0/5000 (default)',
      'user eng/dave minute 0/10 (default)',
      'user eng/carol month 5000/5000 (default) (unregistered)',
      'team sales month 1000/20000',
    ]);
    expect(rows.find((r) => r.id === 'alice' && r.window === 'month')!.forecast).toEqual({ kind: 'runs-out', at: new Date('2026-11-12T10:17:08.571Z') });
    expect(rows.find((r) => r.id === 'alice' && r.window === 'minute')!.forecast).toBeUndefined();
  });

  it('sorts by closeness to exhaustion: month limits by the earliest run-out, then the rest, short windows after them', () => {
    // alice's minute (2 of 10, 20 %) comes after sales's month (1,000 of 20,000, 5 %):
    // it resets each minute.
    expect(sortRows(rows, 'exhaustion').map((r) => `${r.id}/${r.window}`)).toEqual([
      'carol/month', 'alice/month', 'eng/month', 'sales/month', 'alice/minute', 'dave/minute', 'dave/month']);
    expect(sortRows(rows, 'name').map((r) => `${r.id}/${r.window}`)).toEqual([
      'eng/month', 'alice/minute', 'alice/month', 'carol/month', 'dave/minute', 'dave/month', 'sales/month']);
  });

  it('works without usage: everything at 0', () => {
    const none = allocationRows(teams, users, undefined, { start, end, now });
    expect(none.every((r) => r.used === 0 && r.forecast?.kind !== 'runs-out')).toBe(true);
    expect(none.length).toBe(6);
  });
});

describe('sortRows by closeness to exhaustion', () => {
  // One user's limits of every window; used and limit give the share, the forecast
  // is the month's at the pace of the period so far (a third of it gone).
  const r = (id: string, window: Window, used: number, limit: number) => usageRows({
    org: 'acme', period: '2026-11', period_start: start.toISOString(), period_end: end.toISOString(),
    metrics: [{ metric: 'requests', org: { id: 'acme', used, reserved: 0, limits: [] }, teams: [],
      users: [{ id, team: 'eng', used, reserved: 0, limits: [{ window, limit, used, remaining: Math.max(0, limit - used) }] }] }],
  }, { start, end, now })[0];
  const order = (rows: AllocRow[]) => sortRows(rows, 'exhaustion').map((x) => `${x.id} ${x.window} ${forecastText(x.forecast)}`);

  it('ranks a minute window used up after every month limit with something used', () => {
    expect(order([r('min', 'minute', 10, 10), r('sec', 'second', 5, 5), r('lasts', 'month', 10, 1000), r('soon', 'month', 400, 1000), r('out', 'month', 1000, 1000)])).toEqual([
      'out month used up', 'soon month runs out on 26 Nov', 'lasts month lasts the period', 'min minute resets each window', 'sec second resets each window']);
  });
  it('puts month limits that run out this period first, the soonest first, whatever their share', () => {
    // At the pace of the first 10 days: 600 of 1,000 runs out on 17 Nov, 500 of 1,000 on
    // 21 Nov; 300 of 2,000 takes 57 more days, past the period's end.
    expect(order([r('half', 'month', 500, 1000), r('fast', 'month', 600, 1000), r('slow', 'month', 300, 2000)])).toEqual([
      'fast month runs out on 17 Nov', 'half month runs out on 21 Nov', 'slow month lasts the period']);
  });
  it('ranks day limits with the months that last, by share, and before hour windows', () => {
    expect(order([r('hour', 'hour', 99, 100), r('day', 'day', 50, 100), r('month', 'month', 300, 1000), r('conc', 'concurrent', 3, 3)])).toEqual([
      'day day resets each window', 'month month lasts the period', 'conc concurrent resets each window', 'hour hour resets each window']);
  });
  it('puts limits with nothing used last', () => {
    expect(order([r('idle', 'month', 0, 1000), r('min', 'minute', 1, 10)])).toEqual(['min minute resets each window', 'idle month nothing used yet']);
  });
});

describe('usageRows', () => {
  it('lists the levels that used anything with the limits the API applied', async () => {
    const { usageRows } = await import('./allocation');
    const usage: Usage = {
      org: 'acme', period: '2026-11', period_start: start.toISOString(), period_end: end.toISOString(),
      metrics: [{ metric: 'requests', org: { id: 'acme', used: 95, reserved: 0, limits: [] },
        teams: [{ id: 'eng', used: 95, reserved: 0, limits: [{ window: 'month', limit: 100, used: 95, remaining: 5 }] }],
        users: [{ id: 'bob', team: 'eng', used: 95, reserved: 0, limits: [{ window: 'minute', limit: 10, used: 3, remaining: 7 }] }] }],
    };
    const rows = sortRows(usageRows(usage, { start, end, now }), 'exhaustion');
    expect(rows.map((r) => `${r.kind} ${r.team ?? ''}/${r.id} ${r.window} ${r.used}/${r.limit} ${forecastText(r.forecast)}`)).toEqual([
      'team /eng month 95/100 runs out on 11 Nov', 'user eng/bob minute 3/10 resets each window']);
  });
});

describe('reservations', () => {
  // The usage API reports a level's committed units as used and its held units as
  // reserved; a month window's used is their sum (both count against the limit).
  const teams: Team[] = [
    { id: 'eng', org: 'acme', name: 'Engineering', limits: [{ metric: 'requests', window: 'month', limit: 1000 }],
      user_limits: [{ metric: 'requests', window: 'month', limit: 200 }, { metric: 'requests', window: 'minute', limit: 100 }], created_at: '', updated_at: '' },
    { id: 'ops', org: 'acme', name: 'Ops', limits: [{ metric: 'requests', window: 'month', limit: 1000 }], user_limits: [], created_at: '', updated_at: '' },
  ];
  const usage: Usage = {
    org: 'acme', period: '2026-11', period_start: start.toISOString(), period_end: end.toISOString(),
    metrics: [{
      metric: 'requests', daily: [],
      org: { id: 'acme', used: 800, reserved: 160, limits: [] },
      teams: [{ id: 'eng', used: 700, reserved: 160, limits: [{ window: 'month', limit: 1000, used: 860, remaining: 140 }] },
        { id: 'ops', used: 100, reserved: 0, limits: [{ window: 'month', limit: 1000, used: 100, remaining: 900 }] }],
      users: [
        { id: 'bob', team: 'eng', used: 100, reserved: 50, limits: [{ window: 'month', limit: 200, used: 150, remaining: 50 }, { window: 'minute', limit: 100, used: 60, remaining: 40 }] },
        { id: 'erin', team: 'eng', used: 90, reserved: 110, limits: [{ window: 'month', limit: 200, used: 200, remaining: 0 }] },
      ],
    }],
  };
  const rows = allocationRows(teams, {}, usage, { start, end, now });
  const find = (id: string, w = 'month') => rows.find((r) => r.id === id && r.window === w)!;

  it('splits a month window into used and reserved, and counts both against the limit', () => {
    expect(find('eng')).toMatchObject({ used: 700, reserved: 160, limit: 1000, ratio: 0.86 });
    // 860 of 1,000 is amber although 700 alone would not be.
    expect(level(find('eng').used + find('eng').reserved, 1000)).toBe('warn');
    expect(level(find('eng').used, 1000)).toBe('ok');
    expect(find('bob')).toMatchObject({ used: 100, reserved: 50, ratio: 0.75 });
    // erin's 90 used and 110 held reach her 200: used up, red, first in the sort.
    expect(find('erin')).toMatchObject({ used: 90, reserved: 110, ratio: 1, forecast: { kind: 'exhausted' } });
    expect(sortRows(rows, 'exhaustion')[0].id).toBe('erin');
    expect(find('ops')).toMatchObject({ used: 100, reserved: 0, ratio: 0.1 });
  });

  it('leaves held units in used for shorter windows, which the API cannot split', () => {
    expect(find('bob', 'minute')).toMatchObject({ used: 60, reserved: 0, ratio: 0.6 });
  });

  it('forecasts at the pace of used units, with held units counted against the limit but setting no pace', () => {
    // bob: 100 used in 10 days is 10 a day; 200 - 100 - 50 held = 50 left, 5 days.
    expect(find('bob').forecast).toEqual({ kind: 'runs-out', at: new Date('2026-11-16T00:00:00Z') });
    // ops: 100 in a third of the period projects to 300 by its end, with nothing held.
    expect(find('ops').forecast).toEqual({ kind: 'lasts', projected: 300 });
    expect(forecast(100, 1000, start, end, now, 50)).toEqual({ kind: 'lasts', projected: 350 });
    expect(forecast(0, 100, start, end, now, 100)).toEqual({ kind: 'exhausted' });
    expect(forecast(0, 100, start, end, now, 40)).toEqual({ kind: 'idle' });
  });

  it('usageRows splits the same way', () => {
    const u = usageRows(usage, { start, end, now });
    expect(u.filter((r) => r.reserved > 0).map((r) => `${r.kind} ${r.id} ${r.used}+${r.reserved}/${r.limit}`)).toEqual([
      'team eng 700+160/1000', 'user bob 100+50/200', 'user erin 90+110/200']);
  });

  it('heldRows lists who holds units, the most first', () => {
    expect(heldRows(usage).map((h) => `${h.kind} ${h.team ? h.team + '/' : ''}${h.id} ${h.reserved}`)).toEqual([
      'team eng 160', 'user eng/erin 110', 'user eng/bob 50']);
    expect(heldRows(undefined)).toEqual([]);
  });
});

describe('MiniBar', () => {
  function mount(ui: preact.ComponentChild) {
    const root = document.createElement('div');
    act(() => render(ui, root));
    return root;
  }
  it('shows used and reserved as two segments, coloured by their sum', () => {
    const el = mount(<MiniBar used={700} reserved={160} limit={1000} label="eng" />);
    expect(el.querySelector('.mini-bar-text')!.textContent).toBe('700 used + 160 reserved of 1,000 86%');
    expect(el.querySelector('.mini-bar')!.getAttribute('data-level')).toBe('warn');
    expect((el.querySelector('.bar-fill') as HTMLElement).style.width).toBe('70%');
    expect((el.querySelector('.bar-held') as HTMLElement).style.width).toBe('16%');
    expect(el.querySelector('[role=progressbar]')!.getAttribute('aria-valuetext')).toBe('700 used + 160 reserved of 1,000');
  });
  it('keeps the held segment within the bar past the limit', () => {
    const el = mount(<MiniBar used={150} reserved={100} limit={200} label="x" />);
    expect(el.querySelector('.mini-bar')!.getAttribute('data-level')).toBe('over');
    expect((el.querySelector('.bar-fill') as HTMLElement).style.width).toBe('75%');
    expect((el.querySelector('.bar-held') as HTMLElement).style.width).toBe('25%');
  });
  it('without reservations is the plain bar', () => {
    const el = mount(<MiniBar used={5} limit={10} label="x" />);
    expect(el.querySelector('.mini-bar-text')!.textContent).toBe('5 of 10 50%');
    expect(el.querySelector('.bar-held')).toBeNull();
  });
});

describe('open reservation counts', () => {
  const res = (id: string, metric: string, team?: string, user?: string): Reservation =>
    ({ id, state: 'held', org: 'acme', team, user, metric, amount: 5, expires_at: '2026-11-11T00:01:00Z', on_expiry: 'commit' });
  const open = { complete: true, items: [
    res('r1', 'tokens', 'eng', 'alice'), res('r2', 'tokens', 'eng', 'alice'), res('r3', 'tokens', 'eng', 'bob'),
    res('r4', 'tokens', 'eng'), res('r5', 'gpu', 'eng', 'alice'), res('r6', 'tokens', 'ops', 'alice'), res('r7', 'tokens'),
  ] };
  const team: Held = { kind: 'team', id: 'eng', metric: 'tokens', reserved: 20, used: 0 };
  const alice: Held = { kind: 'user', id: 'alice', team: 'eng', metric: 'tokens', reserved: 10, used: 0 };
  it("counts a team's own and its users' reservations of the row's metric", () => {
    expect(openCount(team, open)).toBe(4);
  });
  it("counts a user's reservations in that team and metric only", () => {
    expect(openCount(alice, open)).toBe(2);
    expect(open.items.filter((r) => heldMatches(alice, r)).map((r) => r.id)).toEqual(['r1', 'r2']);
    expect(openCount({ ...alice, team: 'ops' }, open)).toBe(1);
    expect(openCount({ ...alice, metric: 'gpu' }, open)).toBe(1);
  });
  it('counts none when nothing is open', () => {
    expect(openCount(team, { items: [], complete: true })).toBe(0);
  });
});

describe('inFlightRows', () => {
  const usage: Usage = {
    org: 'acme', period: '2026-11', period_start: start.toISOString(), period_end: end.toISOString(),
    metrics: [{
      metric: 'requests', daily: [],
      org: { id: 'acme', used: 10, reserved: 4, in_flight: 4, limits: [{ window: 'concurrent', limit: 8, used: 4, remaining: 4 }] },
      teams: [{ id: 'eng', used: 5, reserved: 3, in_flight: 3, limits: [{ window: 'concurrent', limit: 5, used: 3, remaining: 2 }] },
        { id: 'ops', used: 5, reserved: 1, in_flight: 1, limits: [] }],
      users: [{ id: 'bob', team: 'eng', used: 5, reserved: 3, in_flight: 3, limits: [{ window: 'concurrent', limit: 3, used: 3, remaining: 0 }] },
        { id: 'erin', team: 'ops', used: 5, reserved: 0, limits: [{ window: 'month', limit: 100, used: 5, remaining: 95 }] }],
    }],
  };
  it('lists each level with in_flight, org first, the fullest first, with its concurrent limit', () => {
    expect(inFlightRows(usage).map((r) => `${r.kind} ${r.team ? r.team + '/' : ''}${r.id} ${r.inFlight}/${r.limit ?? '-'}`)).toEqual([
      'org acme 4/8', 'team ops 1/-', 'team eng 3/5', 'user eng/bob 3/3']);
    expect(inFlightRows(undefined)).toEqual([]);
  });
  it('InFlightPanel shows the in-flight units against the concurrent limit', async () => {
    const { InFlightPanel } = await import('./pages/Allocation');
    const root = document.createElement('div');
    act(() => render(<InFlightPanel rows={inFlightRows(usage)} />, root));
    expect(root.querySelector('[data-testid="in-flight-user-eng/bob-requests"] .mini-bar-text')!.textContent).toBe('3 of 3 100%');
    expect(root.querySelector('[data-testid="in-flight-team-ops-requests"] [data-testid="in-flight-units"]')!.textContent).toBe('1');
    act(() => render(<InFlightPanel rows={[]} />, root));
    expect(root.querySelector('[data-testid="in-flight"]')).toBeNull();
  });
});

describe('a token bucket in allocation rows', () => {
  const start = new Date('2026-11-01T00:00:00Z');
  const end = new Date('2026-12-01T00:00:00Z');
  const now = new Date('2026-11-11T00:00:00Z');
  const usage: Usage = {
    org: 'acme', period: '2026-11', period_start: start.toISOString(), period_end: end.toISOString(),
    metrics: [{
      metric: 'requests', daily: [],
      org: { id: 'acme', used: 50, reserved: 0, limits: [] },
      teams: [{ id: 'eng', used: 50, reserved: 0, limits: [{ window: 'second', limit: 10, burst: 30, used: 24, remaining: 6 }] }],
      users: [{ id: 'zed', team: 'eng', used: 5, reserved: 0, limits: [{ window: 'second', limit: 2, burst: 5, used: 5, remaining: 0 }] }],
    }],
  };
  const teams: Team[] = [{ id: 'eng', org: 'acme', name: 'Eng', limits: [{ metric: 'requests', window: 'second', limit: 10, burst: 30 }], user_limits: [],
    created_at: '', updated_at: '' }];

  it('measures the tokens taken against the burst, not the rate', () => {
    const rows = allocationRows(teams, { eng: [] }, usage, { start, end, now });
    expect(rows.find((r) => r.id === 'eng')).toMatchObject({ limit: 10, burst: 30, used: 24, ratio: 0.8 });
    // a user without a record: the bucket the usage API reports for it
    expect(rows.find((r) => r.id === 'zed')).toMatchObject({ limit: 2, burst: 5, used: 5, ratio: 1 });
    expect(usageRows(usage, { start, end, now }).map((r) => `${r.id} ${r.used}/${r.burst}`)).toEqual(['eng 24/30', 'zed 5/5']);
  });
});
