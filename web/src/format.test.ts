import { describe, expect, it } from 'vitest';
import { compact, dayOfPeriod, expiresIn, dailySeries, onDayAxis, formatNumber, formatNumbersIn, formatTime, idError, level, limitField, parseLimit, percent, periodOf, recentPeriods, remainder, setLimit, sortLimits, topByUsage, urlPieces } from './format';
import { ApiError, type Limit } from './api';

describe('numbers', () => {
  it.each([[0, '0'], [999, '999'], [1234567, '1,234,567']])('formatNumber(%d) = %s', (n, want) => expect(formatNumber(n)).toBe(want));
  it.each([[950, '950'], [1200, '1.2k'], [60000, '60k'], [5e6, '5M'], [1.25e9, '1.3B']])('compact(%d) = %s', (n, want) => expect(compact(n)).toBe(want));
  it.each([[0, 100, '0%'], [1, 1000, '<1%'], [42, 100, '42%'], [150, 100, '150%'], [5, 0, '100%'], [0, 0, '0%']])('percent(%d, %d) = %s', (u, l, want) => expect(percent(u, l)).toBe(want));
  it.each([[10, 100, 'ok'], [80, 100, 'warn'], [100, 100, 'over'], [1, 0, 'over']] as const)('level(%d, %d) = %s', (u, l, want) => expect(level(u, l)).toBe(want));
});

describe('formatNumbersIn', () => {
  it('formats the numbers of a 422 like the rest of the console', () => {
    expect(formatNumbersIn('team "ml": requests/month limit 30000 does not fit in org "acme": it has 100000, 80000 is already allocated, 20000 is available'))
      .toBe('team "ml": requests/month limit 30,000 does not fit in org "acme": it has 100,000, 80,000 is already allocated, 20,000 is available');
    expect(formatNumbersIn('org "acme": requests/month limit 1500 is below the 2000 already allocated to its teams.')).toBe('org "acme": requests/month limit 1,500 is below the 2,000 already allocated to its teams.');
  });
  it('leaves ids, small numbers and decimals alone', () => {
    for (const s of ['user "u-12345" in team "2024"', 'at most 128 characters', 'factor 0.5', 'version 1.12345', 'id abc12345']) expect(formatNumbersIn(s)).toBe(s);
  });
});

describe('parseLimit', () => {
  it.each([['5000', 5000], [' 1,000 ', 1000], ['1_000', 1000], ['60k', 60000], ['1.5M', 1500000], ['0', 0], ['2b', 2e9]])('%s is %d', (s, want) => {
    expect(parseLimit(s)).toEqual({ value: want });
  });
  it.each(['', '-1', '1.5', 'abc', '10 apples', '1.0001k'])('%j is refused', (s) => {
    expect(parseLimit(s).error).toBeTruthy();
    expect(parseLimit(s).value).toBeUndefined();
  });
});

describe('idError', () => {
  it('accepts API ids', () => { for (const id of ['eng', 'a', 'ml.team_1:x@y-z']) expect(idError(id)).toBeUndefined(); });
  it('refuses others', () => { for (const id of ['', '-eng', 'has space', 'x'.repeat(129)]) expect(idError(id)).toBeTruthy(); });
});

describe('limits', () => {
  const ls: Limit[] = [{ metric: 'requests', window: 'month', limit: 100 }, { metric: 'requests', window: 'minute', limit: 10 }];
  it('setLimit replaces in place, adds and removes', () => {
    expect(setLimit(ls, 'requests', 'month', 200)).toEqual([{ metric: 'requests', window: 'month', limit: 200 }, ls[1]]);
    expect(setLimit(ls, 'tokens', 'day', 5)).toEqual([...ls, { metric: 'tokens', window: 'day', limit: 5 }]);
    expect(setLimit(ls, 'requests', 'month', null)).toEqual([ls[1]]);
  });
  it('limitField names the field as the API does', () => {
    expect(limitField('limits', ls, 'requests', 'minute')).toBe('limits[1].limit');
    expect(limitField('user_limits', ls, 'requests', 'month')).toBe('user_limits[0].limit');
  });
  it('sortLimits orders by metric then window length', () => {
    expect(sortLimits([ls[0], { metric: 'a', window: 'day', limit: 1 }, ls[1]]).map((l) => `${l.metric}/${l.window}`))
      .toEqual(['a/day', 'requests/minute', 'requests/month']);
  });
  it('remainder subtracts the teams month allocations', () => {
    const org: Limit[] = [...ls, { metric: 'tokens', window: 'month', limit: 50 }];
    const teams = [{ limits: [{ metric: 'requests', window: 'month', limit: 60 } as Limit] }, { limits: [{ metric: 'requests', window: 'month', limit: 30 } as Limit, { metric: 'requests', window: 'minute', limit: 9 } as Limit] }];
    expect(remainder(org, teams)).toEqual([
      { metric: 'requests', limit: 100, allocated: 90, available: 10 },
      { metric: 'tokens', limit: 50, allocated: 0, available: 50 },
    ]);
  });
});

describe('usage', () => {
  it('topByUsage skips zeros and sorts biggest first', () => {
    const lv = (id: string, used: number) => ({ id, used, reserved: 0, limits: [] });
    expect(topByUsage([lv('a', 1), lv('b', 0), lv('c', 5), lv('d', 5)], 2).map((l) => l.id)).toEqual(['c', 'd']);
  });
  describe('dailySeries', () => {
    const start = new Date('2026-11-01T00:00:00Z');
    const end = new Date('2026-12-01T00:00:00Z');
    const now = new Date('2026-11-11T00:00:00Z'); // 10 days in, the start of day index 10
    it('is empty without history: nothing is made up', () => {
      expect(dailySeries([], start, end, now)).toEqual({ actual: [], projected: [], days: 30 });
    });
    it('plots each day at its end, carries gaps forward and projects from the last real point', () => {
      const s = dailySeries([{ day: '2026-11-03', used: 40 }, { day: '2026-11-01', used: 10 }, { day: '2026-11-04', used: 50 }], start, end, now);
      expect(s.days).toBe(30);
      // Day 1 (index 0) ends at x=1 with 10; nothing on day 2, so 10 until day 3 begins (x=2);
      // then 40 and 50 at the ends of days 3 and 4; no change since, so flat to now (x=10).
      expect(s.actual).toEqual([[0, 0], [1, 10], [2, 10], [3, 40], [4, 50], [10, 50]]);
      // 50 in a third of the period: 150 at its end.
      expect(s.projected).toEqual([[10, 50], [30, 150]]);
    });
    it('starts flat at 0 until the first recorded day, and puts today at now', () => {
      const noon = new Date('2026-11-11T12:00:00Z');
      const s = dailySeries([{ day: '2026-11-06', used: 20 }, { day: '2026-11-11', used: 105 }], start, end, noon);
      expect(s.actual).toEqual([[0, 0], [5, 0], [6, 20], [10, 20], [10.5, 105]]);
      expect(s.projected).toEqual([[10.5, 105], [30, 300]]);
    });
    it('draws a first point today as a step at today, not a ramp from day 0', () => {
      // Today is day index 24; it is 00:01, a minute into the day. Nothing was used on the
      // 24 days before: flat at 0 until today began, then today's usage.
      const early = new Date('2026-11-25T00:01:00Z');
      const s = dailySeries([{ day: '2026-11-25', used: 487 }], start, end, early);
      const nowX = (early.getTime() - start.getTime()) / 86400e3;
      expect(s.actual).toEqual([[0, 0], [24, 0], [nowX, 487]]);
      expect(s.actual[2][0]).toBeGreaterThan(24);
      expect(s.projected).toEqual([[nowX, 487], [30, Math.round(487 * 30 / nowX)]]);
      // Later in the day the same, with today's point at now.
      expect(dailySeries([{ day: '2026-11-25', used: 487 }], start, end, new Date('2026-11-25T12:00:00Z')).actual)
        .toEqual([[0, 0], [24, 0], [24.5, 487]]);
      // At the very start of today the step is vertical, still never a ramp.
      expect(dailySeries([{ day: '2026-11-25', used: 487 }], start, end, new Date('2026-11-25T00:00:00Z')).actual)
        .toEqual([[0, 0], [24, 0], [24, 487]]);
    });
    it("draws a first point on the period's first day from 0 within that day", () => {
      expect(dailySeries([{ day: '2026-11-01', used: 30 }], start, end, new Date('2026-11-01T06:00:00Z')).actual).toEqual([[0, 0], [0.25, 30]]);
    });
    it('ends a finished period on its last day, without a projection', () => {
      const s = dailySeries([{ day: '2026-11-02', used: 7 }, { day: '2026-11-30', used: 90 }], start, end, new Date('2026-12-05T00:00:00Z'));
      expect(s.actual).toEqual([[0, 0], [1, 0], [2, 7], [29, 7], [30, 90]]);
      expect(s.projected).toEqual([]);
    });
    it('ignores days outside the period', () => {
      expect(dailySeries([{ day: '2026-10-31', used: 5 }], start, end, now).actual).toEqual([]);
    });
  });
});

describe('periods and times', () => {
  it('periodOf is in UTC', () => expect(periodOf(new Date('2026-12-31T23:30:00-02:00'))).toBe('2027-01'));
  it('recentPeriods crosses years', () => expect(recentPeriods(new Date('2026-02-10T00:00:00Z'), 3)).toEqual(['2026-02', '2026-01', '2025-12']));
  it('formatTime', () => {
    expect(formatTime('2026-11-21T14:05:09Z')).toBe('2026-11-21 14:05 UTC');
    expect(formatTime(null)).toBe('—');
  });
});

describe('ApiError', () => {
  it('finds the message of a field and falls back to the detail', () => {
    const e = new ApiError(422, 'team "ml": does not fit', [{ field: 'limits[0].limit', message: 'it has 100, 90 is allocated' }]);
    expect(e.fieldMessage('limits[0].limit')).toBe('it has 100, 90 is allocated');
    expect(e.fieldMessage('name')).toBeUndefined();
  });
});

describe('expiresIn', () => {
  const now = new Date('2026-11-11T00:00:00Z');
  it('says seconds, minutes, then hours', () => {
    expect(expiresIn('2026-11-11T00:00:42Z', now)).toBe('in 42 s');
    expect(expiresIn('2026-11-11T00:01:59Z', now)).toBe('in 119 s');
    expect(expiresIn('2026-11-11T00:05:00Z', now)).toBe('in 5 min');
    expect(expiresIn('2026-11-11T02:05:00Z', now)).toBe('in 2 h 5 min');
    expect(expiresIn('2026-11-11T03:00:00Z', now)).toBe('in 3 h');
  });
  it('says expired once past, and a dash for no time', () => {
    expect(expiresIn('2026-11-10T23:59:59Z', now)).toBe('expired');
    expect(expiresIn('soon', now)).toBe('—');
  });
});

describe('the pace chart\'s day axis', () => {
  it('counts the days of the period from 1: 27 Nov of a period from 1 Nov is day 27, at 27.x', () => {
    const start = new Date('2026-11-01T00:00:00Z');
    const end = new Date('2026-12-01T00:00:00Z');
    const now = new Date('2026-11-27T15:00:00Z');
    const s = dailySeries([{ day: '2026-11-26', used: 40 }, { day: '2026-11-27', used: 55 }], start, end, now);
    const last = s.actual[s.actual.length - 1];
    expect(dayOfPeriod(last[0], s.days)).toBe(27);
    const plotted = onDayAxis(s.actual);
    expect(plotted[0]).toEqual([1, 0]); // the period begins at day 1
    expect(plotted[plotted.length - 1][0]).toBeCloseTo(27.625, 6); // 15:00 on the 27th
    expect(plotted[plotted.length - 1][1]).toBe(55);
    expect(onDayAxis(s.projected)[1]).toEqual([31, expect.any(Number)]); // the end of day 30
  });
  it('keeps the first and last day in range', () => {
    expect(dayOfPeriod(0, 30)).toBe(1);
    expect(dayOfPeriod(0.99, 30)).toBe(1);
    expect(dayOfPeriod(30, 30)).toBe(30);
  });
});

describe('urlPieces', () => {
  it('splits a URL after "/", ".", "?", "&", "=", "#" and "-", keeping "//" whole', () => {
    const url = 'https://hooks.example.com/qp/eu-west-1/in?source=qp&token=3f9a#top';
    expect(urlPieces(url)).toEqual(['https://', 'hooks.', 'example.', 'com/', 'qp/', 'eu-', 'west-', '1/', 'in?', 'source=', 'qp&', 'token=', '3f9a#', 'top']);
    expect(urlPieces(url).join('')).toBe(url);
  });
  it('leaves a word without break points whole', () => {
    expect(urlPieces('localhost')).toEqual(['localhost']);
    expect(urlPieces('')).toEqual([]);
  });
});

describe('token buckets', () => {
  it('writes a bucket with its rate, window and burst', async () => {
    const { bucketText } = await import('./format');
    expect(bucketText({ window: 'second', limit: 10, burst: 30 })).toBe('10 / second, burst 30');
    expect(bucketText({ window: 'minute', limit: 1200, burst: 5000 })).toBe('1,200 / minute, burst 5,000');
    expect(bucketText({ window: 'month', limit: 10 })).toBe('');
  });
  it('reads a burst field: empty is a sliding window, else 1 or more', async () => {
    const { parseBurst } = await import('./format');
    expect(parseBurst('')).toEqual({});
    expect(parseBurst('  ')).toEqual({});
    expect(parseBurst('3k')).toEqual({ value: 3000 });
    expect(parseBurst('0').error).toMatch(/1 or more/);
    expect(parseBurst('-1').error).toBeDefined();
  });
  it('offers a burst on second to day windows only', async () => {
    const { bucketable } = await import('./format');
    expect((['second', 'minute', 'hour', 'day', 'month', 'concurrent'] as const).map(bucketable)).toEqual([true, true, true, true, false, false]);
  });
  it('sets a limit with its burst, and names the burst field', () => {
    const ls: Limit[] = [{ metric: 'requests', window: 'month', limit: 100 }];
    const next = setLimit(ls, 'requests', 'second', 10, 30);
    expect(next).toEqual([...ls, { metric: 'requests', window: 'second', limit: 10, burst: 30 }]);
    expect(limitField('limits', next, 'requests', 'second', 'burst')).toBe('limits[1].burst');
    expect(setLimit(next, 'requests', 'second', 10)).toEqual([...ls, { metric: 'requests', window: 'second', limit: 10 }]);
  });
});
