// End-to-end test of the console's reservations in real headless Chromium, with the
// harness of harness.mjs (a quotaplane-api built from this checkout on a free port,
// a fresh database, the shared Redis): a check key of the org opens reservations
// through the API (POST /v1/reservations, an hour to live); the allocation page shows
// each team's and user's held units beside the used ones, counted against the limit,
// and lists who holds units in open reservations, the most first, with how many
// reservations hold them; a row expands to list them (GET /v1/orgs/{org}/reservations).
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import path from 'node:path';
import { launchBrowser, must, outDir, startApi, signIn } from './harness.mjs';

const suffix = randomBytes(4).toString('hex');
const ORG = `held-${suffix}`;
const ADMIN = { email: `held-admin-${suffix}@e2e.test`, password: `admin-pw-${suffix}` };

let stack, op, browser;

before(async () => {
  stack = await startApi('held', suffix);
  op = stack.op;
  // An org of 10,000 requests a month; eng holds 1,000 of them, each of its users 200;
  // sales 500.
  await must(op('POST', '/v1/plans', { id: `plan-${suffix}`, name: 'Held', fail_mode: 'open',
    limits: [{ metric: 'requests', window: 'month', limit: 10000 }] }), 201);
  await must(op('POST', '/v1/orgs', { id: ORG, name: 'Held Inc.', plan: `plan-${suffix}` }), 201);
  await must(op('POST', `/v1/orgs/${ORG}/teams`, { id: 'eng', name: 'Engineering', limits: [{ metric: 'requests', window: 'month', limit: 1000 }],
    user_limits: [{ metric: 'requests', window: 'month', limit: 200 }] }), 201);
  await must(op('POST', `/v1/orgs/${ORG}/teams`, { id: 'sales', name: 'Sales', limits: [{ metric: 'requests', window: 'month', limit: 500 }] }), 201);
  await must(op('POST', `/v1/orgs/${ORG}/console-users`, { ...ADMIN, role: 'admin' }), 201);
  browser = await launchBrowser();
});

after(async () => {
  await browser?.close();
  await stack?.stop();
});

test('the allocation shows units held by open reservations for each team and user', async () => {
  const key = (await must(op('POST', `/v1/orgs/${ORG}/api-keys`, { name: 'e2e', scopes: ['check'] }), 201)).secret;
  // alice uses 60 and holds 100 more in two reservations (70 for an hour, 30 for ten
  // minutes); bob uses 40; carol (sales) holds 30.
  for (const c of [{ team: 'eng', user: 'alice', cost: 60 }, { team: 'eng', user: 'bob', cost: 40 }]) {
    assert.equal((await must(op('POST', '/v1/check', { org: ORG, metric: 'requests', ...c }, key), 200)).allowed, true);
  }
  const held = [];
  for (const r of [{ team: 'eng', user: 'alice', amount: 70, ttl_seconds: 3600 }, { team: 'sales', user: 'carol', amount: 30, ttl_seconds: 3600 },
    { team: 'eng', user: 'alice', amount: 30, ttl_seconds: 600, on_expiry: 'release' }]) {
    const res = await must(op('POST', '/v1/reservations', { org: ORG, metric: 'requests', ...r }, key), 201);
    assert.equal(res.state, 'held');
    held.push(res.id);
  }
  const [alice70, carol30, alice30] = held;
  // The API lists them soonest to expire first.
  const open = await must(op('GET', `/v1/orgs/${ORG}/reservations`), 200);
  assert.deepEqual(open.reservations.map((r) => r.id), [alice30, alice70, carol30]);
  assert.equal(open.next_cursor, null);
  // The API's own account, which the page must agree with.
  const usage = (await must(op('GET', `/v1/orgs/${ORG}/usage`), 200)).metrics.find((m) => m.metric === 'requests');
  assert.deepEqual(usage.users.map((u) => `${u.team}/${u.id} ${u.used}+${u.reserved}`), ['eng/alice 60+100', 'eng/bob 40+0', 'sales/carol 0+30']);

  const ctx = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await ctx.newPage();
  const problems = [];
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => { if (m.type() === 'error') problems.push(`console error: ${m.text()}`); });
  try {
    await signIn(page, stack.base, ORG, ADMIN);
    await page.getByRole('navigation', { name: 'Console' }).getByRole('link', { name: 'Allocation', exact: true }).click();
    await page.getByTestId('alloc-usage').waitFor();
    const bar = (who) => page.getByTestId(`alloc-row-${who}-requests-month`).locator('.mini-bar');
    // Held units count against the limit: alice's 60 + 100 of 200 is 80 %, amber.
    const want = {
      'user-eng/alice': ['60 used + 100 reserved of 200 80%', 'warn'],
      'team-eng': ['100 used + 100 reserved of 1,000 20%', 'ok'],
      'team-sales': ['0 used + 30 reserved of 500 6%', 'ok'],
      'user-eng/bob': ['40 of 200 20%', 'ok'],
    };
    for (const [who, [text, lv]] of Object.entries(want)) {
      assert.equal((await bar(who).locator('.mini-bar-text').textContent()).replace(/\s+/g, ' ').trim(), text, who);
      assert.equal(await bar(who).getAttribute('data-level'), lv, who);
      assert.equal(await bar(who).getByTestId('bar-held').count(), text.includes('reserved') ? 1 : 0, who);
    }
    // The lighter segment follows the used one: alice's held 100 of 200 is half the bar.
    const widths = await bar('user-eng/alice').locator('.bar').evaluate((b) => [b.clientWidth, b.querySelector('.bar-fill').clientWidth, b.querySelector('.bar-held').clientWidth]);
    assert.ok(Math.abs(widths[1] - widths[0] * 0.3) <= 1 && Math.abs(widths[2] - widths[0] * 0.5) <= 1, `bar widths ${widths}`);

    assert.equal(await page.getByTestId('org-reserved-requests').textContent(), '130 (1%)');
    const panel = page.getByTestId('held');
    assert.equal(await panel.getByRole('heading').textContent(), 'Held by open reservations');
    const rows = panel.getByTestId('held-rows').locator('tbody tr');
    assert.deepEqual(await rows.evaluateAll((trs) => trs.map((tr) => tr.getAttribute('data-testid'))),
      ['held-team-eng-requests', 'held-user-eng/alice-requests', 'held-team-sales-requests', 'held-user-sales/carol-requests']);
    assert.deepEqual(await panel.getByTestId('held-units').allTextContents(), ['100', '100', '30', '30']);
    // How many open reservations hold them: eng's are alice's two.
    assert.deepEqual(await panel.getByTestId('held-count').allTextContents(), ['2', '2', '1', '1']);
    // alice's row expands to her two reservations, soonest to expire first.
    const aliceRow = panel.getByTestId('held-user-eng/alice-requests');
    await aliceRow.getByTestId('held-toggle').click();
    assert.equal(await aliceRow.getByTestId('held-toggle').getAttribute('aria-expanded'), 'true');
    const list = panel.getByTestId('open-reservations');
    await list.waitFor();
    const listed = list.locator('tbody tr');
    assert.deepEqual(await listed.evaluateAll((trs) => trs.map((tr) => tr.getAttribute('data-testid'))), [`open-${alice30}`, `open-${alice70}`]);
    assert.deepEqual(await list.locator('tbody tr code').allTextContents(), [alice30, alice70]);
    assert.deepEqual(await list.getByTestId('open-amount').allTextContents(), ['30', '70']);
    assert.deepEqual(await list.getByTestId('open-on-expiry').allTextContents(), ['release', 'commit']);
    const expires = await list.getByTestId('open-expires').allTextContents();
    assert.match(expires[0], /^in (9|10) min$/, expires[0]);
    assert.match(expires[1], /^in (59 min|60 min|1 h)$/, expires[1]);
    await page.screenshot({ path: path.join(outDir, 'reservations-open.png'), fullPage: true });
    // The team's row lists the team's, with whose they are; only one row is open at a time.
    await panel.getByTestId('held-team-eng-requests').getByTestId('held-toggle').click();
    await list.locator('tbody tr').first().waitFor();
    assert.equal(await panel.getByTestId('open-reservations').count(), 1);
    assert.deepEqual(await panel.getByTestId('open-reservations').locator('tbody tr code').allTextContents(), [alice30, alice70]);
    assert.equal(await aliceRow.getByTestId('held-toggle').getAttribute('aria-expanded'), 'false');
    await panel.scrollIntoViewIfNeeded();
    await page.screenshot({ path: path.join(outDir, 'reservations.png'), fullPage: true });

    // Released, the units are no longer held: the panel says so after a reload.
    for (const id of held) await must(op('DELETE', `/v1/reservations/${id}`, undefined, key), 200);
    await page.reload();
    await page.getByTestId('alloc-usage').waitFor();
    await page.getByTestId('held').getByText('No team or user holds units in an open reservation.').waitFor();
    assert.equal(await page.getByTestId('org-reserved-requests').count(), 0);
    assert.equal((await bar('user-eng/alice').locator('.mini-bar-text').textContent()).replace(/\s+/g, ' ').trim(), '60 of 200 30%');
  } finally {
    await ctx.close();
  }
  assert.deepEqual(problems, [], 'console errors');
});
