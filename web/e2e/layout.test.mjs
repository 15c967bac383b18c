// End-to-end tests of how the console lays out what it shows, in real headless Chromium
// at 1280 and 390 px, with the harness of harness.mjs:
// - no table heading or word of text is split inside the word, on the webhooks page
//   (a long delivery URL breaks only after "/", ".", "?", "&", "=", "#" or "-") and in
//   the allocation table (ids as long as the API allows included: the table scrolls
//   sideways inside its box instead, and the page never does);
// - every metric with a month limit draws that limit on its chart of the period, far
//   below it or near it;
// - no page of the console splits a word (Overview, Allocation, API keys, Audit log,
//   Billing export, Entitlements, Webhooks, Mode and its dialog, the shadow report,
//   Password) for an org whose every id, name and email is as long as the API allows:
//   ids and names are cut short with an ellipsis (whole in their title), tables scroll
//   sideways inside their box, and the page never does;
// - "Closest to exhaustion" ranks a minute window used up (it resets each minute) after
//   every month limit that has something used.
// Words are found split with brokenWords (harness.mjs): a word whose Range has client
// rectangles on two or more lines.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import path from 'node:path';
import { brokenWords, launchBrowser, must, outDir, pgArgs, pgEnv, signIn, startApi } from './harness.mjs';

const suffix = randomBytes(4).toString('hex');
const ORG = `layout-${suffix}`;
const ADMIN = { email: `layout-admin-${suffix}@e2e.test`, password: `admin-pw-${suffix}` };
// Ids as long as the API allows (128 characters, nowhere to break).
const LONG_TEAM = `t${'0123456789'.repeat(12)}${suffix}`.slice(0, 127) + 'x';
const LONG_USER = `u${'abcdefghij'.repeat(12)}${suffix}`.slice(0, 127) + 'z';
const HOOK = `https://hooks.example.com/quotaplane/receivers/production-eu-west-1/deliveries?source=quotaplane&token=3f9a1c7e5b2d4f60${suffix}`;

// A second org, in shadow mode, where everything a page shows is as long as allowed: its
// id, its plan's, its team's and user's (128 characters), a feature's name (64) and value
// (256), an API key's name (200) and its admin's email (254), which the audit log names.
const LONG_ORG = `o${'9876543210'.repeat(12)}${suffix}`.slice(0, 127) + 'g';
const LONG_PLAN = `p${'plan567890'.repeat(12)}${suffix}`.slice(0, 127) + 'n';
const LONG_FEATURE = `f${'feature890'.repeat(6)}${suffix}`.slice(0, 63) + 'e';
const LONG_VALUE = `v${'value67890'.repeat(25)}${suffix}`.slice(0, 255) + 'v';
const LONG_KEY = `k${'keyname890'.repeat(20)}`.slice(0, 199) + 'y';
const LONG_ADMIN = { email: `${`a${suffix}${'x'.repeat(64)}`.slice(0, 64)}@${['d'.repeat(59), 'e'.repeat(59), 'f'.repeat(60)].join('.')}.e2e.test`,
  password: `long-admin-pw-${suffix}` };

let stack, op, browser, key;

before(async () => {
  stack = await startApi('layout', suffix);
  op = stack.op;
  await must(op('POST', '/v1/plans', { id: `plan-${suffix}`, name: 'Layout', fail_mode: 'open', limits: [
    { metric: 'requests', window: 'month', limit: 100000 }, { metric: 'requests', window: 'minute', limit: 600 },
    { metric: 'tokens', window: 'month', limit: 10000 }] }), 201);
  await must(op('POST', '/v1/orgs', { id: ORG, name: 'Layout Inc.', plan: `plan-${suffix}`, webhook_url: HOOK }), 201);
  await must(op('POST', `/v1/orgs/${ORG}/teams`, { id: 'eng', name: 'Engineering',
    limits: [{ metric: 'requests', window: 'month', limit: 60000 }, { metric: 'tokens', window: 'month', limit: 8000 }],
    user_limits: [{ metric: 'requests', window: 'month', limit: 5000 }] }), 201);
  await must(op('POST', `/v1/orgs/${ORG}/teams`, { id: LONG_TEAM, name: 'A team with the longest id', limits: [{ metric: 'requests', window: 'month', limit: 1000 }] }), 201);
  await must(op('POST', `/v1/orgs/${ORG}/teams/eng/users`, { id: LONG_USER }), 201);
  // dave-1280 and dave-390: 10 requests a minute (and the team's 5,000 a month), one for
  // the test at each width (a minute window slides: one user's minute used up by the
  // test at 1280 px would still count in part at 390 px a minute later).
  for (const dave of ['dave-1280', 'dave-390']) {
    await must(op('POST', `/v1/orgs/${ORG}/teams/eng/users`, { id: dave, limits: [{ metric: 'requests', window: 'minute', limit: 10 }] }), 201);
  }
  await must(op('POST', `/v1/orgs/${ORG}/console-users`, { ...ADMIN, role: 'admin' }), 201);
  key = (await must(op('POST', `/v1/orgs/${ORG}/api-keys`, { name: 'e2e', scopes: ['check'] }), 201)).secret;
  // Requests far below the org's month limit, tokens near it.
  const batch = await must(op('POST', '/v1/check/batch', { checks: [
    { org: ORG, team: 'eng', user: 'alice', cost: 240 }, { org: ORG, team: 'eng', user: 'carol', cost: 90 },
    { org: ORG, team: LONG_TEAM, user: 'frank', cost: 5 }, { org: ORG, team: 'eng', user: LONG_USER, cost: 3 },
    { org: ORG, team: 'eng', user: 'erin', metric: 'tokens', cost: 6000 }] }, key), 200);
  assert.ok(batch.results.every((r) => r.allowed), JSON.stringify(batch));
  // Then alice gets 250 a month (96 % used) and carol 80 (past it).
  await must(op('POST', `/v1/orgs/${ORG}/teams/eng/users`, { id: 'alice', limits: [{ metric: 'requests', window: 'month', limit: 250 }] }), 201);
  await must(op('POST', `/v1/orgs/${ORG}/teams/eng/users`, { id: 'carol', limits: [{ metric: 'requests', window: 'month', limit: 80 }] }), 201);
  // Two deliveries to the long URL, written as the worker writes them (no worker runs here).
  const sql = `WITH e AS (INSERT INTO billing_events (org_id, type, period, dedup_key, payload)
      VALUES ('${ORG}', 'usage.threshold', to_char(now(), 'YYYY-MM'), 'e2e', '{}') RETURNING id)
    INSERT INTO webhook_deliveries (event_id, org_id, url, attempt, status_code, error, succeeded)
    SELECT id, '${ORG}', '${HOOK}', a, s, err, ok FROM e,
      (VALUES (1, 502, 'receiver answered 502', false), (2, 204, '', true)) AS x(a, s, err, ok)`;
  execFileSync('psql', [...pgArgs, '-d', stack.dbName, '-v', 'ON_ERROR_STOP=1', '-qc', sql], { env: pgEnv });
  await seedLongOrg();
  browser = await launchBrowser();
});

// seedLongOrg makes LONG_ORG: a shadow org whose long user went over a minute limit (the
// shadow report has a row naming the user and the team), with a key of the longest name
// that its admin created through the console (the audit log names the admin).
async function seedLongOrg() {
  assert.equal(LONG_ADMIN.email.length, 254);
  await must(op('POST', '/v1/plans', { id: LONG_PLAN, name: 'Long', fail_mode: 'open',
    limits: [{ metric: 'requests', window: 'month', limit: 100000 }], features: { [LONG_FEATURE]: LONG_VALUE, sso: true } }), 201);
  await must(op('POST', '/v1/orgs', { id: LONG_ORG, name: 'Long Ltd.', plan: LONG_PLAN, mode: 'shadow' }), 201);
  await must(op('POST', `/v1/orgs/${LONG_ORG}/teams`, { id: LONG_TEAM, name: 'A team with the longest id',
    limits: [{ metric: 'requests', window: 'month', limit: 1000 }], user_limits: [{ metric: 'requests', window: 'minute', limit: 1 }] }), 201);
  await must(op('POST', `/v1/orgs/${LONG_ORG}/console-users`, { ...LONG_ADMIN, role: 'admin' }), 201);
  // The admin creates the key through the console's session (the audit log's actor is console:<email>).
  const res = await fetch(stack.base + '/console/api/sign-in', { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ org: LONG_ORG, email: LONG_ADMIN.email, password: LONG_ADMIN.password }) });
  assert.equal(res.status, 200, await res.clone().text());
  const session = await res.json();
  const cookie = res.headers.getSetCookie().map((c) => c.split(';')[0]).join('; ');
  const made = await fetch(stack.base + `/v1/orgs/${LONG_ORG}/api-keys`, { method: 'POST',
    headers: { 'Content-Type': 'application/json', 'X-CSRF-Token': session.csrf_token, Cookie: cookie },
    body: JSON.stringify({ name: LONG_KEY, scopes: ['check'] }) });
  assert.equal(made.status, 201, await made.clone().text());
  const longKey = (await made.json()).secret;
  for (let i = 0; i < 3; i++) {
    const c = await must(op('POST', '/v1/check', { org: LONG_ORG, team: LONG_TEAM, user: LONG_USER, cost: 1 }, longKey), 200);
    assert.equal(c.allowed, true, 'a shadow org is never denied');
  }
  // The engine adds its would-block counts to Redis about once a second.
  for (const end = Date.now() + 15_000; ; await new Promise((r) => setTimeout(r, 200))) {
    const rep = await must(op('GET', `/v1/orgs/${LONG_ORG}/would-block`), 200);
    if (rep.rows.length > 0) break;
    assert.ok(Date.now() < end, `no would-block row: ${JSON.stringify(rep)}`);
  }
}

after(async () => {
  await browser?.close();
  await stack?.stop();
});

// withPage opens a signed-in page at width; console and page errors fail the test.
async function withPage(name, width, fn, org = ORG, who = ADMIN) {
  const ctx = await browser.newContext({ viewport: { width, height: 900 } });
  const page = await ctx.newPage();
  const problems = [];
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => { if (m.type() === 'error') problems.push(`console error: ${m.text()}`); });
  try {
    await signIn(page, stack.base, org, who);
    await fn(page);
  } finally {
    await page.screenshot({ path: path.join(outDir, `${name}-${width}.png`), fullPage: true }).catch(() => {});
    await ctx.close();
  }
  assert.deepEqual(problems, []);
}

const nav = (page, name) => page.getByRole('navigation', { name: 'Console' }).getByRole('link', { name, exact: true }).click();
const sideways = (page) => page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);

// goTo shows the console's page at path as its links do (without reloading the console).
const goTo = (page, p) => page.evaluate((to) => { history.pushState(null, '', '/console/' + to); window.dispatchEvent(new PopStateEvent('popstate')); }, p);

// The pages of LONG_ORG: each path, its heading, and what to wait for (or do) before the
// words are looked at; open, when given, opens a dialog checked too.
const LONG_PAGES = [
  { path: '', heading: 'Overview', ready: (p) => p.getByTestId('closest').waitFor() },
  { path: 'allocation', heading: 'Allocation', ready: (p) => p.getByRole('heading', { name: 'Teams and users' }).waitFor() },
  { path: 'keys', heading: 'API keys', ready: (p) => p.getByTestId('keys').locator('tbody tr').first().waitFor(),
    open: (p) => p.getByRole('button', { name: 'Revoke' }).first().click() },
  { path: 'audit', heading: 'Audit log', ready: async (p) => {
    await p.getByTestId('audit').locator('tbody tr').first().waitFor();
    // Every change's before and after shown too.
    await p.getByTestId('audit').locator('details').evaluateAll((ds) => ds.forEach((d) => { d.open = true; }));
  } },
  { path: 'billing', heading: 'Billing export', ready: (p) => p.getByTestId('download').waitFor() },
  { path: 'entitlements', heading: 'Entitlements', ready: (p) => p.getByTestId(`feature-${LONG_FEATURE}`).waitFor() },
  { path: 'webhooks', heading: 'Webhooks', ready: (p) => p.getByRole('heading', { name: 'Recent deliveries' }).waitFor() },
  { path: 'settings', heading: 'Enforcement mode', ready: (p) => p.getByTestId('current-mode').waitFor(),
    open: (p) => p.getByRole('button', { name: 'Switch to warn' }).click() },
  { path: 'shadow-report', heading: 'Shadow and warn report', ready: (p) => p.getByTestId('report-rows').locator('tbody tr').first().waitFor() },
  { path: 'password', heading: 'Password', ready: (p) => p.getByRole('button', { name: 'Change password' }).waitFor() },
];

for (const width of [1280, 390]) {
  for (const pg of LONG_PAGES) {
    test(`at ${width} px the ${pg.heading} page splits no word of an org whose ids, names and email are as long as allowed`, async () => {
      await withPage(`layout-long-${pg.path || 'overview'}`, width, async (page) => {
        await goTo(page, pg.path);
        await page.locator('main').getByRole('heading', { name: pg.heading, exact: true, level: 1 }).waitFor();
        await pg.ready(page);
        const text = await page.locator('main').textContent();
        const broken = await page.evaluate(brokenWords, { selector: 'header.top, main' });
        assert.deepEqual(broken, [], `words split at ${width} px`);
        assert.ok(await sideways(page) <= 0, 'the page scrolls sideways');
        if (pg.path === 'audit') assert.ok(text.includes(`console:${LONG_ADMIN.email}`) && text.includes(LONG_KEY), 'the long actor and key name are there whole');
        if (pg.path === 'shadow-report') assert.ok(text.includes(LONG_USER) && text.includes(LONG_TEAM), 'the long ids are there whole');
        if (pg.path === 'entitlements') assert.ok(text.includes(LONG_VALUE) && text.includes(LONG_PLAN), 'the long value and plan are there whole');
        if (pg.path === 'keys') assert.ok(text.includes(LONG_KEY), 'the long key name is there whole');
        if (pg.open) {
          await pg.open(page);
          const dialog = page.getByRole('dialog');
          await dialog.waitFor();
          assert.deepEqual(await page.evaluate(brokenWords, { selector: 'dialog' }), [], `words split in the dialog at ${width} px`);
          assert.ok(await sideways(page) <= 0, 'the page scrolls sideways with the dialog open');
          await page.screenshot({ path: path.join(outDir, `layout-long-${pg.path}-dialog-${width}.png`) });
          await dialog.getByRole('button', { name: 'Cancel' }).click();
        }
      }, LONG_ORG, LONG_ADMIN);
    });
  }

  test(`at ${width} px the webhooks page splits no heading or word, and the URL only where a URL may break`, async () => {
    await withPage('layout-webhooks', width, async (page) => {
      await nav(page, 'Webhooks');
      const rows = page.getByTestId('deliveries').locator('tbody tr');
      await rows.nth(1).waitFor();
      assert.equal(await rows.nth(0).locator('td').last().textContent(), HOOK);
      assert.equal(await page.getByTestId('webhook-url').textContent(), HOOK);
      const broken = await page.evaluate(brokenWords, { selector: '[data-testid="deliveries"] th, [data-testid="deliveries"] td, [data-testid="webhook"]' });
      assert.deepEqual(broken, [], `words split at ${width} px`);
      assert.ok(await sideways(page) <= 0, 'the page scrolls sideways');
      // The whole table, for a look: unclipped by its box.
      await page.evaluate(() => document.querySelectorAll('.table-wrap').forEach((w) => { w.style.overflow = 'visible'; }));
      await page.getByTestId('deliveries').screenshot({ path: path.join(outDir, `layout-deliveries-${width}.png`) });
    });
  });

  test(`at ${width} px the allocation table splits no heading or word, 128-character ids included`, async () => {
    await withPage('layout-allocation', width, async (page) => {
      await nav(page, 'Allocation');
      const table = page.getByTestId('alloc-usage');
      await table.getByTestId(`alloc-row-user-eng/${LONG_USER}-requests-month`).waitFor();
      const broken = await page.evaluate(brokenWords, { selector: '[data-testid="alloc-usage"] th, [data-testid="alloc-usage"] td' });
      assert.deepEqual(broken, [], `words split at ${width} px`);
      // The whole id is there for the reader (in its title where it is cut short).
      const cell = table.getByTestId(`alloc-row-team-${LONG_TEAM}-requests-month`).locator('td').first();
      assert.ok((await cell.textContent()).includes(LONG_TEAM));
      assert.ok(await sideways(page) <= 0, 'the page scrolls sideways');
      // The whole table, for a look: unclipped by its box.
      await page.evaluate(() => document.querySelectorAll('.table-wrap').forEach((w) => { w.style.overflow = 'visible'; }));
      await page.getByTestId('alloc-usage').screenshot({ path: path.join(outDir, `layout-alloc-usage-${width}.png`) });
    });
  });

  test(`at ${width} px every metric with a month limit draws it on its chart, near it or far below`, async () => {
    await withPage('layout-charts', width, async (page) => {
      for (const [metric, limit] of [['requests', '100,000'], ['tokens', '10,000']]) {
        const chart = page.getByTestId(`history-${metric}`).locator('.chart');
        await chart.locator('canvas').waitFor();
        // The limit's colour (#dc2626), in the line and its legend: nothing else is red.
        const red = await chart.locator('canvas').evaluate((c) => {
          const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
          let n = 0;
          for (let i = 0; i < d.length; i += 4) if (d[i] > 180 && d[i + 1] < 80 && d[i + 2] < 80 && d[i + 3] > 200) n++;
          return n;
        });
        assert.ok(red > 50, `${metric}: no month limit drawn (${red} red pixels)`);
        assert.match(await chart.getAttribute('aria-label'), new RegExp(`the month limit of ${limit} drawn as a red line`));
      }
    });
  });

  test(`at ${width} px a minute window used up ranks after every month limit with something used`, async () => {
    // dave-<width> uses his 10 requests of this minute; the page must load within the minute.
    const daveId = `dave-${width}`;
    const sec = new Date().getUTCSeconds();
    if (sec > 40) await new Promise((r) => setTimeout(r, (61 - sec) * 1000));
    const res = await op('POST', '/v1/check', { org: ORG, team: 'eng', user: daveId, cost: 10 }, key);
    const minute = res.body.levels.find((l) => l.id === daveId && l.window === 'minute');
    assert.equal(minute.used, 10, JSON.stringify(res.body));
    const windowOf = (id) => /-(second|minute|hour|day|month|concurrent)$/.exec(id)[1];
    await withPage('layout-closest', width, async (page) => {
      const closest = page.getByTestId('closest').locator('tbody tr');
      await closest.first().waitFor();
      const ids = await closest.evaluateAll((rs) => rs.map((r) => r.dataset.testid));
      assert.equal(ids[0], 'alloc-row-user-eng/carol-requests-month', ids.join('\n'));
      const firstShort = ids.findIndex((id) => windowOf(id) !== 'month');
      if (firstShort >= 0) assert.ok(ids.slice(firstShort).every((id) => windowOf(id) !== 'month'), `a short window before a month limit:\n${ids.join('\n')}`);
      assert.match(await page.locator('#close-h + p').textContent(), /reset/);
      // The allocation's full list: dave's minute (10 of 10) after every month limit with something used.
      await nav(page, 'Allocation');
      const rows = page.getByTestId('alloc-usage').locator('tbody tr');
      await page.getByTestId(`alloc-row-user-eng/${daveId}-requests-minute`).waitFor();
      const all = await rows.evaluateAll((rs) => rs.map((r) => ({ id: r.dataset.testid, text: r.querySelector('.mini-bar-text').textContent })));
      const dave = all.findIndex((r) => r.id === `alloc-row-user-eng/${daveId}-requests-minute`);
      assert.match(all[dave].text, /^10 of 10/, 'the minute rolled over before the page loaded');
      const usedMonths = all.filter((r) => windowOf(r.id) === 'month' && !/^0 of/.test(r.text));
      assert.ok(usedMonths.length >= 5);
      for (const r of usedMonths) assert.ok(all.indexOf(r) < dave, `${r.id} (${r.text}) ranks after dave's minute`);
    });
  });
}
