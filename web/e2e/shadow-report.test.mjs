// End-to-end test of the console's shadow and warn report in real headless Chromium,
// with the harness of harness.mjs (a quotaplane-api built from this checkout on
// a free port, a fresh database, the shared Redis): an org in shadow mode makes checks
// over its limits through the API; the Mode page links to the report, which shows the
// teams and users enforcing would block, per limit and per day, equal to the checks'
// would_block answers. Earlier days of the period are seeded in Postgres as a worker
// would have persisted them (a Redis epoch of their own), since no worker runs here.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import path from 'node:path';
import { launchBrowser, must, outDir, pgArgs, pgEnv, startApi, signIn } from './harness.mjs';

const suffix = randomBytes(4).toString('hex');
const ORG = `shadow-${suffix}`;
const ADMIN = { email: `shadow-admin-${suffix}@e2e.test`, password: `admin-pw-${suffix}` };

let stack, op, browser;

before(async () => {
  stack = await startApi('shadow', suffix);
  op = stack.op;
  // A shadow org of 1,000 requests a month; each user of eng may make 5 a minute.
  await must(op('POST', '/v1/plans', { id: `plan-${suffix}`, name: 'Shadow', fail_mode: 'open',
    limits: [{ metric: 'requests', window: 'month', limit: 1000 }] }), 201);
  await must(op('POST', '/v1/orgs', { id: ORG, name: 'Shadow Inc.', plan: `plan-${suffix}`, mode: 'shadow' }), 201);
  await must(op('POST', `/v1/orgs/${ORG}/teams`, { id: 'eng', name: 'Engineering', limits: [{ metric: 'requests', window: 'month', limit: 600 }],
    user_limits: [{ metric: 'requests', window: 'minute', limit: 5 }] }), 201);
  await must(op('POST', `/v1/orgs/${ORG}/teams`, { id: 'sales', name: 'Sales', limits: [{ metric: 'requests', window: 'month', limit: 100 }] }), 201);
  await must(op('POST', `/v1/orgs/${ORG}/console-users`, { ...ADMIN, role: 'admin' }), 201);
  browser = await launchBrowser();
});

after(async () => {
  await browser?.close();
  await stack?.stop();
});

test('the Mode page of a shadow org links to the report of who enforcing would block', async () => {
  const key = (await must(op('POST', `/v1/orgs/${ORG}/api-keys`, { name: 'e2e', scopes: ['check'] }), 201)).secret;
  // alice: 9 checks of 1 against 5 a minute; bob: 2 of 3; sales: 150 units against 100 a month.
  const answers = new Map();
  const checks = [...Array(9).fill({ team: 'eng', user: 'alice', cost: 1 }), { team: 'eng', user: 'bob', cost: 3 }, { team: 'eng', user: 'bob', cost: 3 },
    { team: 'sales', user: 'carol', cost: 80 }, { team: 'sales', user: 'carol', cost: 70 }];
  for (const c of checks) {
    const res = await must(op('POST', '/v1/check', { org: ORG, metric: 'requests', ...c }, key), 200);
    assert.equal(res.allowed, true, 'a shadow org is never denied');
    if (res.would_block) {
      const k = `${res.would_block.level}-${res.would_block.level === 'user' ? c.team + '-' : ''}${res.would_block.id}-requests-${res.would_block.window}`;
      answers.set(k, (answers.get(k) ?? 0) + 1);
    }
  }
  assert.ok(answers.size >= 2, `would_block answers: ${[...answers]}`);
  const total = [...answers.values()].reduce((a, b) => a + b, 0);
  // The engine adds its counts to Redis about once a second.
  let rep;
  for (const end = Date.now() + 10_000; ; await new Promise((r) => setTimeout(r, 200))) {
    rep = await must(op('GET', `/v1/orgs/${ORG}/would-block`), 200);
    if (rep.checks === total || Date.now() > end) break;
  }
  assert.equal(rep.checks, total, JSON.stringify(rep));

  // Earlier days of the period, as the worker would have persisted them.
  const start = new Date(rep.period_start).getTime();
  const today = new Date(new Date().toISOString().slice(0, 10) + 'T00:00:00Z').getTime();
  const earlier = [6, 3, 1].map((n) => today - n * 86_400_000).filter((t) => t >= start).map((t) => new Date(t).toISOString().slice(0, 10));
  const seeded = earlier.map((d, i) => `('${ORG}', '${rep.period}', 'e2e-seed', 'requests', 'user', 'eng', 'alice', 'minute', '${d}', ${4 + 3 * i}, ${4 + 3 * i})`);
  if (seeded.length) {
    execFileSync('psql', [...pgArgs, '-d', stack.dbName, '-v', 'ON_ERROR_STOP=1', '-qc',
      `INSERT INTO would_block (org_id, period, epoch, metric, level, team_id, user_id, win, day, checks, units) VALUES ${seeded.join(',')}`], { env: pgEnv });
  }
  const aliceKey = 'user-eng-alice-requests-minute';
  const aliceTotal = (answers.get(aliceKey) ?? 0) + earlier.reduce((a, _, i) => a + 4 + 3 * i, 0);

  const ctx = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await ctx.newPage();
  const problems = [];
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => { if (m.type() === 'error') problems.push(`console error: ${m.text()}`); });
  try {
    await signIn(page, stack.base, ORG, ADMIN);
    await page.getByRole('navigation', { name: 'Console' }).getByRole('link', { name: 'Mode', exact: true }).click();
    assert.equal(await page.getByTestId('current-mode').textContent(), 'shadow');
    await page.getByTestId('shadow-report-link').click();
    await page.getByRole('heading', { name: 'Shadow and warn report' }).waitFor();
    assert.match(page.url(), /\/console\/shadow-report$/);
    await page.getByTestId('report-rows').waitFor();
    assert.match(await page.getByTestId('report-summary').textContent(), /is in shadow mode: nothing is denied/);
    assert.equal(await page.getByTestId('report-checks').textContent(), String(total + aliceTotal - (answers.get(aliceKey) ?? 0)));
    for (const [k, n] of answers) {
      const want = k === aliceKey ? aliceTotal : n;
      assert.equal(await page.getByTestId(`report-row-${k}`).getByTestId('row-checks').textContent(), want.toLocaleString('en-US'), k);
    }
    // Most checks first: alice, with her earlier days, leads; her strip marks each day.
    assert.equal(await page.getByTestId('report-rows').locator('tbody tr').first().getAttribute('data-testid'), `report-row-${aliceKey}`);
    // Each row's heading says its level once, in the badge ("user alice (team eng): ...").
    for (const th of await page.getByTestId('report-rows').locator('tbody th').allTextContents()) {
      assert.doesNotMatch(th, /\b(user|team|org|other)\s+\1\b/i, `the row heading "${th}" repeats its level`);
    }
    assert.match(await page.getByTestId(`report-row-${aliceKey}`).locator('th').textContent(), /^user alice \(team \w+\): /);
    const strip = page.getByTestId(`report-row-${aliceKey}`).getByTestId('row-days');
    assert.equal(await strip.locator('.day.hit').count(), earlier.length + 1);
    assert.equal(await page.getByTestId('report-days').locator('.day.hit').count(), earlier.length + 1);
    assert.equal(await page.getByTestId('report-capped').count(), 0);
    const list = await page.getByTestId('report-days-list').textContent();
    for (const d of earlier) {
      assert.ok(list.includes(new Date(d + 'T00:00:00Z').toLocaleDateString('en-GB', { day: 'numeric', month: 'short', timeZone: 'UTC' })), `${d} missing from "${list}"`);
    }
    assert.equal(await page.getByRole('navigation', { name: 'Console' }).getByRole('link', { name: 'Overview', exact: true }).count(), 1);
    await page.screenshot({ path: path.join(outDir, 'shadow-report.png'), fullPage: true });
  } finally {
    await ctx.close();
  }
  assert.deepEqual(problems, [], 'console errors');
});
