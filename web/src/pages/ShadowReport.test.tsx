import { describe, expect, test } from 'vitest';
import { dayCounts, periodDays, rowHeading, rowLabel } from './ShadowReport';

describe('shadow report', () => {
  test('periodDays lists every UTC day of the period, end excluded', () => {
    const d = periodDays('2026-11-01T00:00:00Z', '2026-12-01T00:00:00Z');
    expect(d).toHaveLength(30);
    expect(d[0]).toBe('2026-11-01');
    expect(d[29]).toBe('2026-11-30');
    expect(periodDays('2026-02-15T00:00:00Z', '2026-03-15T00:00:00Z')).toHaveLength(28);
  });
  test('dayCounts fills the days without counts with 0', () => {
    const days = periodDays('2026-11-01T00:00:00Z', '2026-11-04T00:00:00Z');
    expect(dayCounts(days, [{ day: '2026-11-02', checks: 3, units: 7 }])).toEqual([
      { day: '2026-11-01', checks: 0, units: 0 },
      { day: '2026-11-02', checks: 3, units: 7 },
      { day: '2026-11-03', checks: 0, units: 0 },
    ]);
  });
  test('rowLabel names the limit, a user with its team, and the overflow row', () => {
    expect(rowLabel({ level: 'user', id: 'alice', team: 'eng', metric: 'requests', window: 'minute', checks: 1, units: 1, days: [] }))
      .toBe('user alice (team eng): requests per minute');
    expect(rowLabel({ level: 'org', id: 'acme', metric: 'tokens', window: 'month', checks: 1, units: 1, days: [] }))
      .toBe('org acme: tokens per month (billing period)');
    expect(rowLabel({ level: 'other', checks: 1, units: 1, days: [] })).toBe('Other limits (beyond the cap)');
  });
  test('the row heading after the level badge does not say the level again', () => {
    const rows = [
      { level: 'user' as const, id: 'alice', team: 'eng', metric: 'requests', window: 'minute' as const, checks: 1, units: 1, days: [] },
      { level: 'team' as const, id: 'eng', metric: 'tokens', window: 'day' as const, checks: 1, units: 1, days: [] },
      { level: 'org' as const, id: 'acme', metric: 'tokens', window: 'month' as const, checks: 1, units: 1, days: [] },
      { level: 'other' as const, checks: 1, units: 1, days: [] },
    ];
    expect(rows.map((r) => `${r.level} ${rowHeading(r)}`)).toEqual([
      'user alice (team eng): requests per minute',
      'team eng: tokens per day',
      'org acme: tokens per month (billing period)',
      'other limits beyond the cap',
    ]);
  });
});
