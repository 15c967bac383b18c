// End-to-end test of the console's in-flight view (concurrency limits) in real headless
// Chromium, with the harness of harness.mjs: a check key of the org holds slots through
// the API (POST /v1/reservations against `concurrent` limits); the allocation page shows
// each level's units in flight against its concurrent limit, in its table and in the In
// flight panel, and a release gives the slot back at once.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import path from 'node:path';
import { launchBrowser, must, outDir, startApi, signIn } from './harness.mjs';

const suffix = randomBytes(4).toString('hex');
const ORG = `conc-${suffix}`;
const ADMIN = { email: `conc-admin-${suffix}@e2e.test`, password: `admin-pw-${suffix}` };

let stack, op, browser;

before(async () => {
  stack = await startApi('conc', suffix);
  op = stack.op;
  // At most 8 requests in flight for the org, 5 for eng, 3 for each of its users.
  await must(op('POST', '/v1/plans', { id: `plan-${suffix}`, name: 'Conc', fail_mode: 'open',
    limits: [{ metric: 'requests', window: 'concurrent', limit: 8 }, { metric: 'requests', window: 'month', limit: 10000 }] }), 201);
  await must(op('POST', '/v1/orgs', { id: ORG, name: 'Conc Inc.', plan: `plan-${suffix}` }), 201);
  await must(op('POST', `/v1/orgs/${ORG}/teams`, { id: 'eng', name: 'Engineering', limits: [{ metric: 'requests', window: 'concurrent', limit: 5 }],
    user_limits: [{ metric: 'requests', window: 'concurrent', limit: 3 }] }), 201);
  await must(op('POST', `/v1/orgs/${ORG}/console-users`, { ...ADMIN, role: 'admin' }), 201);
  browser = await launchBrowser();
});

after(async () => {
  await browser?.close();
  await stack?.stop();
});

test('the allocation shows units in flight against concurrent limits per level', async () => {
  const key = (await must(op('POST', `/v1/orgs/${ORG}/api-keys`, { name: 'e2e', scopes: ['check'] }), 201)).secret;
  const held = [];
  for (const user of ['alice', 'alice', 'bob']) {
    const res = await must(op('POST', '/v1/reservations', { org: ORG, team: 'eng', user, metric: 'requests', amount: 1, ttl_seconds: 3600 }, key), 201);
    held.push(res.id);
  }
  const usage = (await must(op('GET', `/v1/orgs/${ORG}/usage`), 200)).metrics.find((m) => m.metric === 'requests');
  assert.equal(usage.org.in_flight, 3);
  assert.deepEqual(usage.users.map((u) => `${u.id} ${u.in_flight}`), ['alice 2', 'bob 1']);

  const ctx = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await ctx.newPage();
  const problems = [];
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => { if (m.type() === 'error') problems.push(`console error: ${m.text()}`); });
  try {
    await signIn(page, stack.base, ORG, ADMIN);
    await page.getByRole('navigation', { name: 'Console' }).getByRole('link', { name: 'Allocation', exact: true }).click();
    const panel = page.getByTestId('in-flight');
    await panel.waitFor();
    assert.equal(await panel.getByRole('heading').textContent(), 'In flight');
    const text = async (loc) => (await loc.locator('.mini-bar-text').textContent()).replace(/\s+/g, ' ').trim();
    const want = {
      'org-': ['3 of 8 37%', 'ok'],
      'team-eng': ['3 of 5 60%', 'ok'],
      'user-eng/alice': ['2 of 3 66%', 'ok'],
      'user-eng/bob': ['1 of 3 33%', 'ok'],
    };
    for (const [who, [t, lv]] of Object.entries(want)) {
      const row = panel.getByTestId(`in-flight-${who === 'org-' ? `org-${ORG}` : who}-requests`);
      assert.equal(await text(row), t, who);
      assert.equal(await row.locator('.mini-bar').getAttribute('data-level'), lv, who);
    }
    // The allocation table's concurrent rows read "in flight", with the same use.
    const alice = page.getByTestId('alloc-row-user-eng/alice-requests-concurrent');
    assert.match(await alice.textContent(), /requests in flight/);
    assert.equal(await text(alice), '2 of 3 66%');
    assert.match(await alice.textContent(), /frees as holders settle/);
    await panel.scrollIntoViewIfNeeded();
    await page.screenshot({ path: path.join(outDir, 'in-flight.png'), fullPage: true });

    // Released, the slots are back at once: nothing in flight after a reload.
    for (const id of held) await must(op('DELETE', `/v1/reservations/${id}`, undefined, key), 200);
    await page.reload();
    await page.getByTestId('in-flight').waitFor();
    assert.equal(await text(page.getByTestId(`in-flight-org-${ORG}-requests`)), '0 of 8 0%');
  } finally {
    await ctx.close();
  }
  assert.deepEqual(problems, [], 'console errors');
});
