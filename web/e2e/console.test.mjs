// End-to-end tests of the web console in real headless Chromium (Debian's, driven by
// playwright-core; nothing is downloaded). They start a quotaplane-api built from this
// repository on a free port against a fresh Postgres database and the shared Redis,
// seed an org through the operator API and use the console as an org admin and a
// viewer would. Every test saves a screenshot under test-output/e2e/ and fails on any
// console error it did not expect.
//
// Needs: QP_API_BIN (the built api; scripts/e2e.sh builds it), Postgres reachable with
// createdb/dropdb (DATABASE_URL's server, default 127.0.0.1:5432 user postgres) and
// Redis (REDIS_URL, default redis://127.0.0.1:6379/0). CHROMIUM overrides /usr/bin/chromium.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, copyFileSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { keepLog } from './harness.mjs';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const outDir = path.join(root, 'test-output', 'e2e');
mkdirSync(outDir, { recursive: true });

const suffix = randomBytes(4).toString('hex');
const ORG = `e2e-${suffix}`;
const OP = randomBytes(24).toString('hex');
const WEBHOOK_MASTER = randomBytes(24).toString('hex');
const ADMIN = { email: `admin-${suffix}@e2e.test`, password: `admin-pw-${suffix}` };
const VIEWER = { email: `viewer-${suffix}@e2e.test`, password: `viewer-pw-${suffix}` };
// Ids as long as the API allows (128 characters, no space to break at): no card or table may overflow with them.
const LONG_TEAM = `t${'0123456789'.repeat(12)}${suffix}`.slice(0, 127) + 'x';
const LONG_USER = `u${'abcdefghij'.repeat(12)}${suffix}`.slice(0, 127) + 'z';
const pgBase = new URL(process.env.DATABASE_URL || 'postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable');
const dbName = `qp_e2e_${suffix}`;
const pgArgs = ['-h', pgBase.hostname, '-p', pgBase.port || '5432', '-U', decodeURIComponent(pgBase.username || 'postgres')];

let api, base, browser;
let apiLog = '';
const state = {};

async function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => { const { port } = s.address(); s.close(() => resolve(port)); });
    s.on('error', reject);
  });
}

async function op(method, p, body, token = OP) {
  const res = await fetch(base + p, { method, headers: { Authorization: `Bearer ${token}`, 'Content-Type': 'application/json' }, body: body && JSON.stringify(body) });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : undefined, headers: res.headers };
}

before(async () => {
  const bin = process.env.QP_API_BIN;
  assert.ok(bin, 'set QP_API_BIN to a built quotaplane-api (scripts/e2e.sh does)');
  execFileSync('createdb', [...pgArgs, dbName], { env: { ...process.env, PGPASSWORD: decodeURIComponent(pgBase.password || '') } });
  const dbURL = new URL(pgBase);
  dbURL.pathname = '/' + dbName;
  const port = await freePort();
  base = `http://127.0.0.1:${port}`;
  api = spawn(bin, [], {
    env: { ...process.env, DATABASE_URL: dbURL.toString(), REDIS_URL: process.env.REDIS_URL || 'redis://127.0.0.1:6379/0',
      QUOTA_ADMIN_TOKEN: OP, QUOTA_HTTP_ADDR: `127.0.0.1:${port}`, QUOTA_GRPC_ADDR: '127.0.0.1:0', QUOTA_LOG_LEVEL: 'warn', QUOTA_WEBHOOK_SECRET: WEBHOOK_MASTER },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  api.stdout.on('data', (d) => { apiLog += d; });
  api.stderr.on('data', (d) => { apiLog += d; });
  keepLog(api, 'console');
  const deadline = Date.now() + 60_000;
  for (;;) {
    try { if ((await fetch(base + '/readyz')).ok) break; } catch { /* not up yet */ }
    if (api.exitCode !== null || Date.now() > deadline) throw new Error(`quotaplane-api did not become ready:\n${apiLog}`);
    await new Promise((r) => setTimeout(r, 200));
  }
  // The org: 100,000 requests a month, of which two teams hold 80,000.
  const must = async (r, want) => { const res = await r; assert.equal(res.status, want, JSON.stringify(res.body)); return res.body; };
  await must(op('POST', '/v1/plans', { id: `plan-${suffix}`, name: 'E2E', fail_mode: 'open',
    limits: [{ metric: 'requests', window: 'month', limit: 100000 }, { metric: 'requests', window: 'minute', limit: 600 }] }), 201);
  await must(op('POST', '/v1/orgs', { id: ORG, name: 'Acme Inc.', plan: `plan-${suffix}` }), 201);
  await must(op('POST', `/v1/orgs/${ORG}/teams`, { id: 'eng', name: 'Engineering', limits: [{ metric: 'requests', window: 'month', limit: 60000 }],
    user_limits: [{ metric: 'requests', window: 'month', limit: 5000 }] }), 201);
  await must(op('POST', `/v1/orgs/${ORG}/teams`, { id: 'sales', name: 'Sales', limits: [{ metric: 'requests', window: 'month', limit: 20000 }] }), 201);
  await must(op('POST', `/v1/orgs/${ORG}/teams`, { id: LONG_TEAM, name: 'A team with the longest id' }), 201);
  await must(op('POST', `/v1/orgs/${ORG}/teams/eng/users`, { id: LONG_USER }), 201);
  await must(op('POST', `/v1/orgs/${ORG}/console-users`, { ...ADMIN, role: 'admin' }), 201);
  await must(op('POST', `/v1/orgs/${ORG}/console-users`, { ...VIEWER, role: 'viewer' }), 201);

  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
  });
});

after(async () => {
  await browser?.close();
  if (api && api.exitCode === null) {
    api.kill('SIGTERM');
    await new Promise((r) => { api.once('exit', r); setTimeout(r, 10_000); });
  }
  try { execFileSync('dropdb', [...pgArgs, '--force', '--if-exists', dbName], { env: { ...process.env, PGPASSWORD: decodeURIComponent(pgBase.password || '') } }); } catch (e) { console.error('dropdb:', e.message); }
});

/**
 * withPage opens a fresh browser context (no cookies) at the given width, runs fn and
 * saves a screenshot. Any console error or page error fails the test unless it is a
 * failed request whose status is in allow (the API's expected answer to a refused change).
 */
async function withPage(name, { width = 1280, allow = [] } = {}, fn) {
  const ctx = await browser.newContext({ viewport: { width, height: 900 }, acceptDownloads: true });
  await ctx.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: base }).catch(() => {});
  const page = await ctx.newPage();
  const problems = [];
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() !== 'error') return;
    const st = /status of (\d{3})/.exec(m.text());
    if (st && allow.includes(Number(st[1]))) return;
    problems.push(`console error: ${m.text()}`);
  });
  try {
    await fn(page, ctx);
  } finally {
    await page.screenshot({ path: path.join(outDir, `${name}.png`), fullPage: true }).catch(() => {});
    await ctx.close();
  }
  assert.deepEqual(problems, [], `${name}: console errors`);
}

async function signIn(page, who) {
  await page.goto(base + '/console/');
  await page.getByLabel('Organization').fill(ORG); // console emails are unique per org only
  await page.getByLabel('Email').fill(who.email);
  await page.getByLabel('Password').fill(who.password);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('heading', { name: 'Overview' }).waitFor();
}

async function nav(page, name) {
  await page.getByRole('navigation', { name: 'Console' }).getByRole('link', { name, exact: true }).click();
}

describe('web console', { concurrency: false }, () => {
  test('an admin signs in and sees the overview', async () => {
    await withPage('01-overview', {}, async (page) => {
      await signIn(page, ADMIN);
      assert.equal(await page.getByTestId('plan').textContent(), `plan-${suffix}`);
      assert.equal(await page.getByTestId('mode').textContent(), 'enforce');
      assert.equal(await page.getByTestId('remainder-requests').textContent(), '20,000');
      assert.equal(await page.getByTestId('role').textContent(), 'admin');
      await page.getByTestId('metric-requests').waitFor();
      // Nothing used yet: no history, and the chart says so instead of drawing one.
      await page.getByTestId('history-requests').getByText('No daily history yet', { exact: false }).waitFor();
      assert.equal(await page.getByTestId('history-requests').locator('canvas').count(), 0);
      // The same page at phone width: nothing spills sideways.
      await page.setViewportSize({ width: 390, height: 844 });
      const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
      assert.ok(overflow <= 0, `page is ${overflow}px wider than a 390px screen`);
      await page.screenshot({ path: path.join(outDir, '01-overview-390.png'), fullPage: true });
    });
  });

  test('an admin creates a team within the remainder', async () => {
    await withPage('02-create-team', {}, async (page) => {
      await signIn(page, ADMIN);
      await nav(page, 'Allocation');
      await page.getByRole('button', { name: 'Add team' }).click();
      await page.getByLabel('Team id').fill('ml');
      await page.getByLabel('Name').fill('Machine learning');
      await page.getByLabel('Month limit of the team').fill('15k');
      await page.getByLabel('Month default per user').fill('1000');
      const created = page.waitForResponse((r) => r.url().endsWith(`/v1/orgs/${ORG}/teams`) && r.request().method() === 'POST');
      await page.getByRole('button', { name: 'Create team' }).click();
      assert.equal((await created).status(), 201);
      await page.getByTestId('team-ml').waitFor();
      await page.getByTestId('alloc-remainder-requests').filter({ hasText: '5,000' }).waitFor();
    });
  });

  test('an over-allocation shows the 422 beside the field', async () => {
    await withPage('03-over-allocation', { allow: [422] }, async (page) => {
      await signIn(page, ADMIN);
      await nav(page, 'Allocation');
      const team = page.getByTestId('team-ml');
      await team.getByRole('button', { name: 'Edit requests per month limit of Team ml' }).click();
      const input = team.getByRole('textbox', { name: 'requests per month limit', exact: true });
      // While a row is edited, the headings and the row's metric and window keep their
      // words whole, at desktop and phone width ("Me tric" before, issue 27).
      for (const width of [1280, 390]) {
        await page.setViewportSize({ width, height: 900 });
        const broken = await team.locator('.limits table:has(tr.editing)').evaluate((table) => {
          const cells = [...table.querySelectorAll('thead th'), ...[...table.querySelectorAll('tr.editing td')].slice(0, 2)].filter((c) => !c.querySelector('.sr-only'));
          return cells.flatMap((c) => {
            const r = document.createRange();
            r.selectNodeContents(c);
            const lines = new Set([...r.getClientRects()].filter((x) => x.width > 0).map((x) => Math.round(x.top)));
            return lines.size > 1 ? [`${c.textContent} (${lines.size} lines)`] : [];
          });
        });
        assert.deepEqual(broken, [], `cells broken over lines at ${width}px while editing`);
      }
      await page.setViewportSize({ width: 1280, height: 900 });
      await page.screenshot({ path: path.join(outDir, '03-editing-limit.png'), fullPage: true });
      await input.fill('30000');
      const refused = page.waitForResponse((r) => r.url().endsWith(`/v1/orgs/${ORG}/teams/ml`) && r.request().method() === 'PATCH');
      await team.getByRole('button', { name: 'Save' }).click();
      assert.equal((await refused).status(), 422);
      const msg = team.locator('.field-error');
      await msg.waitFor();
      const text = await msg.textContent();
      // The numbers written as the form writes them (the API sends 100000).
      assert.match(text, /100,000/, 'names what the org has');
      assert.match(text, /80,000|95,000/, 'names what is allocated');
      assert.doesNotMatch(text, /(^|[\s(])\d{4,}/, 'leaves no number unformatted');
      // Beside the field: in the same form, and the input points at it.
      assert.equal(await input.getAttribute('aria-describedby'), await msg.getAttribute('id'));
      assert.equal(await input.getAttribute('aria-invalid'), 'true');
      const t = await op('GET', `/v1/orgs/${ORG}/teams/ml`);
      assert.equal(t.body.limits.find((l) => l.window === 'month').limit, 15000, 'nothing was written');
    });
  });

  test('an admin creates a key, a check uses it and its usage appears', async () => {
    await withPage('04-key-and-usage', { allow: [] }, async (page) => {
      await signIn(page, ADMIN);
      await nav(page, 'API keys');
      await page.getByLabel('Name').fill('e2e-check');
      await page.getByRole('button', { name: 'Create key' }).click();
      const secret = (await page.getByTestId('key-secret').textContent()).trim();
      assert.match(secret, /^qpk_/);
      await page.getByRole('button', { name: 'Copy' }).click();
      await page.getByTestId('keys').getByRole('cell', { name: 'e2e-check' }).waitFor();

      const check = await op('POST', '/v1/check', { org: ORG, team: 'ml', user: 'u-e2e', metric: 'requests', cost: 7 }, secret);
      assert.equal(check.status, 200, JSON.stringify(check.body));
      assert.equal(check.body.allowed, true);
      const orgMonth = check.body.levels.find((l) => l.level === 'org' && l.window === 'month');
      assert.equal(orgMonth.used, 7);
      // Some more traffic from other teams and users, so the overview has something to rank.
      const batch = await op('POST', '/v1/check/batch', { checks: [
        { org: ORG, team: 'eng', user: 'alice', cost: 240 }, { org: ORG, team: 'eng', user: 'carol', cost: 90 },
        { org: ORG, team: 'sales', user: 'bob', cost: 150 }] }, secret);
      assert.equal(batch.status, 200, JSON.stringify(batch.body));
      assert.ok(batch.body.results.every((r) => r.allowed), JSON.stringify(batch.body));
      const total = 7 + 240 + 90 + 150;

      await nav(page, 'Overview');
      const usage = await op('GET', `/v1/orgs/${ORG}/usage`);
      if (usage.status === 501) {
        // The usage API is not in this build: the overview says so, and the check's own
        // answer above is the usage we can see.
        await page.getByTestId('usage-unavailable').waitFor();
        state.usageAPI = false;
      } else {
        assert.equal(usage.status, 200, JSON.stringify(usage.body));
        state.usageAPI = true;
        await page.getByTestId('metric-requests').getByText(`${total} of 100,000`, { exact: false }).first().waitFor();
        await page.getByTestId('top-teams').getByRole('cell', { name: 'ml', exact: true }).waitFor();
        assert.equal(await page.getByTestId('top-teams').locator('tbody tr').first().locator('td').first().textContent(), 'eng');
        await page.getByTestId('top-users').getByText('u-e2e').waitFor();
        // The history: today's point is the live total (no worker runs here, so nothing
        // earlier was recorded), and the chart draws it instead of the empty state.
        const daily = usage.body.metrics.find((m) => m.metric === 'requests').daily;
        assert.deepEqual(daily, [{ day: new Date().toISOString().slice(0, 10), used: total }]);
        const history = page.getByTestId('history-requests');
        await history.locator('canvas').waitFor();
        assert.equal(await history.getByText('No daily history yet', { exact: false }).count(), 0);
        assert.match(await history.locator('.chart').getAttribute('aria-label'), new RegExp(`requests: ${total} used so far`));
        // The axis counts the period's days from 1: today is day N of the period, not N - 1 (issue 27).
        const start = new Date(usage.body.period_start).getTime();
        const days = Math.round((new Date(usage.body.period_end).getTime() - start) / 86400e3);
        const today = Math.floor((Date.now() - start) / 86400e3) + 1;
        assert.match(await history.locator('.chart').getAttribute('aria-label'), new RegExp(`\\(day ${today} of ${days}\\); the month limit of 100,000 drawn as a red line$`));
      }
      await page.screenshot({ path: path.join(outDir, 'console-overview.png'), fullPage: true });
    });
  });

  test('the allocation shows every team and user against its allocation, closest to exhaustion first', async () => {
    // After the checks above (eng: alice 240, carol 90; sales: bob 150; ml: u-e2e 7), give
    // alice and carol allocations of their own: alice at 96 %, carol past hers.
    assert.equal((await op('POST', `/v1/orgs/${ORG}/teams/eng/users`, { id: 'alice', limits: [{ metric: 'requests', window: 'month', limit: 250 }] })).status, 201);
    assert.equal((await op('POST', `/v1/orgs/${ORG}/teams/eng/users`, { id: 'carol', limits: [{ metric: 'requests', window: 'month', limit: 80 }] })).status, 201);
    const usage = await op('GET', `/v1/orgs/${ORG}/usage`);
    assert.equal(usage.status, 200, JSON.stringify(usage.body));
    await withPage('11-allocation-usage', {}, async (page) => {
      await signIn(page, ADMIN);
      // The overview leads with who is closest to running out.
      const closest = page.getByTestId('closest').locator('tbody tr');
      await closest.first().waitFor();
      assert.equal(await closest.nth(0).getAttribute('data-testid'), 'alloc-row-user-eng/carol-requests-month');
      assert.equal(await closest.nth(1).getAttribute('data-testid'), 'alloc-row-user-eng/alice-requests-month');
      await page.screenshot({ path: path.join(outDir, 'console-overview.png'), fullPage: true });
      await nav(page, 'Allocation');
      const table = page.getByTestId('alloc-usage');
      await table.waitFor();
      const rows = table.locator('tbody tr');
      const first = rows.nth(0);
      assert.equal(await first.getAttribute('data-testid'), 'alloc-row-user-eng/carol-requests-month');
      assert.equal(await first.getAttribute('data-level'), 'over');
      assert.match(await first.textContent(), /90 of 80 112%.*used up/);
      const second = rows.nth(1);
      assert.equal(await second.getAttribute('data-testid'), 'alloc-row-user-eng/alice-requests-month');
      assert.equal(await second.getAttribute('data-level'), 'warn');
      // 240 used since the period began; the last 10 at that pace:
      const start = new Date(usage.body.period_start).getTime();
      const now = Date.now();
      const runsOut = new Date(now + 10 / (240 / (now - start)));
      const day = new Intl.DateTimeFormat('en-GB', { day: 'numeric', month: 'short', timeZone: 'UTC' }).format(runsOut);
      const text = await second.textContent();
      assert.match(text, /240 of 250 96%/);
      if (runsOut < new Date(usage.body.period_end)) assert.match(text, new RegExp(`runs out on ${day}`));
      else assert.match(text, /lasts the period/);
      // A user without a record (bob of sales, which has no user defaults) has no row;
      // a registered one without limits of its own gets the team's defaults.
      const long = page.getByTestId(`alloc-row-user-eng/${LONG_USER}-requests-month`);
      assert.match(await long.textContent(), /\(team default\).*0 of 5,000 0%.*nothing used yet/);
      await page.getByTestId(`user-eng-${LONG_USER}`).getByText('No limits of its own: the user defaults of eng apply.').waitFor();
      assert.doesNotMatch(await page.getByTestId(`user-eng-${LONG_USER}`).textContent(), /only the levels above apply/);
      // The remainder: 95,000 of 100,000 allocated to teams.
      assert.equal(await page.getByTestId('alloc-remainder-requests').textContent(), '5,000');
      await page.screenshot({ path: path.join(outDir, 'console-allocation.png'), fullPage: true });
      // By name: the teams in order, each followed by its users.
      await page.getByTestId('alloc-sort').selectOption('name');
      assert.equal(await rows.nth(0).getAttribute('data-testid'), 'alloc-row-team-eng-requests-month');
      assert.equal(await rows.nth(1).getAttribute('data-testid'), 'alloc-row-user-eng/alice-requests-month');
      // Nothing spills sideways at phone width, 128-character ids included.
      await page.setViewportSize({ width: 390, height: 844 });
      const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
      assert.ok(overflow <= 0, `the allocation is ${overflow}px wider than a 390px screen`);
      await page.screenshot({ path: path.join(outDir, '11-allocation-usage-390.png'), fullPage: true });
    });
  });

  test('under a throttle the overview measures usage against the throttled limits', async () => {
    assert.equal((await op('PUT', `/v1/orgs/${ORG}/throttle`, { factor: 0.5, ttl_seconds: 300, reason: 'e2e: our 5xx rate is up' })).status, 200);
    try {
      await withPage('12-throttled-overview', {}, async (page) => {
        await signIn(page, ADMIN);
        await page.getByTestId('throttle').waitFor();
        const bars = page.getByTestId('metric-requests').locator('.usage-bar');
        await bars.first().waitFor();
        const text = (await bars.allTextContents()).join(' | ');
        // The minute limit of 600 is 300 under the throttle; the month is not throttled.
        assert.match(text, /per minute.* of 300 \(.*\)\s*throttled from 600/, text);
        assert.match(text, /of 100,000 \([^)]*\)(?! throttled)/, text);
        assert.equal(await page.getByTestId('metric-requests').getByTestId('throttled-from').count(), 1);
        const minute = bars.filter({ hasText: 'of 300' }).getByRole('progressbar');
        assert.equal(await minute.getAttribute('aria-valuemax'), '300');
      });
    } finally {
      await op('DELETE', `/v1/orgs/${ORG}/throttle`);
    }
  });

  test('a viewer finds no way to change anything', async () => {
    await withPage('05-viewer', { allow: [403] }, async (page) => {
      await signIn(page, VIEWER);
      assert.equal(await page.getByTestId('role').textContent(), 'viewer');
      const editControls = 'main button.inline-edit, main button.danger, main button.primary, main button.link, main input, main form';
      for (const name of ['Allocation', 'API keys', 'Mode']) {
        await nav(page, name);
        await page.locator('main h1').waitFor();
        await page.waitForLoadState('networkidle');
        assert.equal(await page.locator(editControls).count(), 0, `${name} shows edit controls to a viewer`);
      }
      await nav(page, 'Allocation');
      await page.getByTestId('team-ml').waitFor();
      assert.equal(await page.locator(editControls).count(), 0);
      // Forcing a change with the session and its CSRF token still gets 403.
      const forced = await page.evaluate(async (org) => {
        const s = await (await fetch('/console/api/session')).json();
        const res = await fetch(`/v1/orgs/${org}/teams`, { method: 'POST', headers: { 'Content-Type': 'application/json', 'X-CSRF-Token': s.csrf_token },
          body: JSON.stringify({ id: 'sneaky', name: 'Sneaky' }) });
        const mode = await fetch(`/v1/orgs/${org}`, { method: 'PATCH', headers: { 'Content-Type': 'application/json', 'X-CSRF-Token': s.csrf_token },
          body: JSON.stringify({ mode: 'shadow' }) });
        return [res.status, mode.status];
      }, ORG);
      assert.deepEqual(forced, [403, 403]);
      assert.equal((await op('GET', `/v1/orgs/${ORG}/teams/sneaky`)).status, 404);
    });
  });

  test('an admin sees the webhook URL and copies its signing secret; a viewer does not see it', async () => {
    const hookURL = 'https://hooks.example.com/quotaplane';
    assert.equal((await op('PATCH', `/v1/orgs/${ORG}`, { webhook_url: hookURL })).status, 200);
    const settings = await op('GET', `/v1/orgs/${ORG}/webhook`);
    assert.equal(settings.status, 200, JSON.stringify(settings.body));
    assert.match(settings.body.signing_secret, /^[0-9a-f]{64}$/);
    await withPage('10-webhooks', {}, async (page) => {
      await signIn(page, ADMIN);
      await nav(page, 'Webhooks');
      await page.getByTestId('webhook-url').getByText(hookURL).waitFor();
      const secret = page.getByTestId('webhook-secret');
      assert.doesNotMatch(await secret.textContent(), /[0-9a-f]{64}/, 'the secret is hidden until asked for');
      await page.getByRole('button', { name: 'Show' }).click();
      assert.equal(await secret.textContent(), settings.body.signing_secret);
      await page.getByRole('button', { name: 'Copy secret' }).click();
      await page.getByText('Copied.').waitFor();
      assert.equal(await page.evaluate(() => navigator.clipboard.readText()), settings.body.signing_secret);
      await page.getByText('No deliveries yet', { exact: false }).waitFor();
      // No worker runs here, so the log gets two attempts the way the worker writes them:
      // a 502, then a success.
      const sql = `WITH e AS (INSERT INTO billing_events (org_id, type, period, dedup_key, payload)
          VALUES ('${ORG}', 'usage.threshold', to_char(now(), 'YYYY-MM'), 'e2e', '{}') RETURNING id)
        INSERT INTO webhook_deliveries (event_id, org_id, url, attempt, status_code, error, succeeded)
        SELECT id, '${ORG}', '${hookURL}', a, s, err, ok FROM e,
          (VALUES (1, 502, 'receiver answered 502', false), (2, 204, '', true)) AS x(a, s, err, ok)`;
      execFileSync('psql', [...pgArgs, '-d', dbName, '-v', 'ON_ERROR_STOP=1', '-qc', sql],
        { env: { ...process.env, PGPASSWORD: decodeURIComponent(pgBase.password || '') } });
      await page.getByRole('button', { name: 'Refresh' }).click();
      const rows = page.getByTestId('deliveries').locator('tbody tr');
      await rows.nth(1).waitFor();
      assert.equal(await rows.count(), 2);
      assert.match(await rows.nth(0).textContent(), /usage\.threshold.*2.*204/);
      assert.match(await rows.nth(1).textContent(), /usage\.threshold.*1.*502.*receiver answered 502/);
      // A public URL gets no warning; a loopback one says the worker refuses it by default.
      assert.equal(await page.getByTestId('webhook-url-warning').count(), 0);
      assert.equal((await op('PATCH', `/v1/orgs/${ORG}`, { webhook_url: 'http://127.0.0.1:9000/hook' })).status, 200);
      await page.getByRole('button', { name: 'Refresh' }).click();
      await page.getByTestId('webhook-url-warning').getByText('loopback address', { exact: false }).waitFor();
      assert.match(await page.getByTestId('webhook-url-warning').textContent(), /QUOTA_WEBHOOK_ALLOW_PRIVATE=true/);
      assert.equal((await op('PATCH', `/v1/orgs/${ORG}`, { webhook_url: hookURL })).status, 200);
    });
    await withPage('10-webhooks-viewer', {}, async (page) => {
      await signIn(page, VIEWER);
      await nav(page, 'Webhooks');
      await page.getByTestId('webhook-note').getByText('viewer', { exact: false }).waitFor();
      assert.equal(await page.getByTestId('webhook-secret').count(), 0);
      assert.equal(await page.getByRole('button', { name: 'Copy secret' }).count(), 0);
      const body = await page.evaluate(async (org) => (await fetch(`/v1/orgs/${org}/webhook`)).text(), ORG);
      assert.ok(!body.includes(settings.body.signing_secret), 'the API gives a viewer the secret');
    });
  });

  test('an admin edits the webhook URL and sends a test event; a private address is refused and explained', async () => {
    // A real receiver on this machine: the api runs as in production (no
    // QUOTA_WEBHOOK_ALLOW_PRIVATE), so it must refuse to send to it.
    let received = 0;
    const recv = http.createServer((req, res) => { received++; res.writeHead(204).end(); });
    await new Promise((r) => recv.listen(0, '127.0.0.1', r));
    const local = `http://127.0.0.1:${recv.address().port}/hook`;
    try {
      await withPage('12-webhook-test', { allow: [422] }, async (page) => {
        await signIn(page, ADMIN);
        await nav(page, 'Webhooks');
        await page.getByRole('button', { name: 'Edit URL' }).click();
        const input = page.getByLabel('Webhook URL');
        await input.fill('hooks.example.com');
        await page.getByRole('button', { name: 'Save URL' }).click();
        await page.locator('#webhook-url-error').getByText('http:// or https://', { exact: false }).waitFor();
        assert.equal(await input.getAttribute('aria-describedby'), 'webhook-url-error');
        await input.fill(local);
        await page.getByRole('button', { name: 'Save URL' }).click();
        await page.getByTestId('webhook-url').getByText(local).waitFor();
        assert.equal((await op('GET', `/v1/orgs/${ORG}`)).body.webhook_url, local);
        const warning = page.getByTestId('webhook-url-warning');
        await warning.getByText('127.0.0.1 is a loopback address', { exact: false }).waitFor();
        assert.match(await warning.textContent(), /only to public internet addresses/);

        await page.getByRole('button', { name: 'Send a test event' }).click();
        const result = page.getByTestId('webhook-test-result');
        await result.waitFor();
        const text = await result.textContent();
        assert.match(text, /refused/);
        assert.match(text, new RegExp(`Refused: ${local.replace(/[.]/g, '\\.')} is not a public address`));
        assert.match(text, /See the warning above: 127\.0\.0\.1 is a loopback address/);
        assert.equal(received, 0, 'the api sent to a loopback address');
        await page.screenshot({ path: path.join(outDir, 'console-webhooks.png'), fullPage: true });
        // The test send is in the audit log.
        const audit = await op('GET', `/v1/orgs/${ORG}/audit?limit=5`);
        assert.ok(audit.body.items.some((e) => e.action === 'webhook.test' && e.actor === `console:${ADMIN.email}`), JSON.stringify(audit.body.items));

        // Back to the public URL, through the form.
        await page.getByRole('button', { name: 'Edit URL' }).click();
        await page.getByLabel('Webhook URL').fill('https://hooks.example.com/quotaplane');
        await page.getByRole('button', { name: 'Save URL' }).click();
        await page.getByTestId('webhook-url').getByText('https://hooks.example.com/quotaplane').waitFor();
        assert.equal(await page.getByTestId('webhook-url-warning').count(), 0);
      });
    } finally {
      recv.close();
    }
  });

  test('an admin switches the mode after confirming, and the audit log shows it', async () => {
    await withPage('06-mode-and-audit', {}, async (page) => {
      await signIn(page, ADMIN);
      await nav(page, 'Mode');
      await page.getByRole('button', { name: 'Switch to shadow' }).click();
      const dialog = page.getByRole('dialog');
      await dialog.waitFor();
      await dialog.getByRole('button', { name: 'Cancel' }).click();
      assert.equal(await page.getByTestId('current-mode').textContent(), 'enforce');
      await page.getByRole('button', { name: 'Switch to shadow' }).click();
      await page.getByRole('dialog').getByRole('button', { name: 'Switch to shadow' }).click();
      await page.getByTestId('current-mode').filter({ hasText: 'shadow' }).waitFor();
      assert.equal((await op('GET', `/v1/orgs/${ORG}`)).body.mode, 'shadow');
      await nav(page, 'Audit log');
      await page.getByTestId('audit').getByRole('cell', { name: `console:${ADMIN.email}` }).first().waitFor();
      await page.getByTestId('audit').getByRole('cell', { name: 'org.update' }).first().waitFor().catch(() => {});
    });
  });

  test('the billing export downloads for a picked period', async () => {
    await withPage('07-billing', { allow: [501, 503] }, async (page) => {
      await signIn(page, ADMIN);
      await nav(page, 'Billing export');
      await page.getByLabel('JSON').check();
      const href = await page.getByTestId('download').getAttribute('href');
      assert.match(href, new RegExp(`^/v1/orgs/${ORG}/billing/export\\?period=\\d{4}-\\d{2}&format=json$`));
      await page.getByLabel('CSV').check();
      const status = await page.evaluate(async (u) => (await fetch(u)).status, await page.getByTestId('download').getAttribute('href'));
      if (status === 200) {
        const [download] = await Promise.all([page.waitForEvent('download'), page.getByTestId('download').click()]);
        const file = path.join(outDir, 'billing-export.csv');
        await download.saveAs(file);
        copyFileSync(file, file); // saved for a look
      } else {
        assert.equal(status, 501, 'only a build without billing exports may refuse');
      }
    });
  });

  test('every page fits a 390px phone screen', async () => {
    await withPage('08-phone', { width: 390 }, async (page) => {
      await signIn(page, ADMIN);
      for (const name of ['Overview', 'Allocation', 'API keys', 'Audit log', 'Billing export', 'Webhooks', 'Mode']) {
        await nav(page, name);
        await page.locator('main h1').waitFor();
        await page.waitForLoadState('networkidle');
        const { overflow, culprits } = await page.evaluate(() => ({
          overflow: document.documentElement.scrollWidth - window.innerWidth,
          culprits: [...document.querySelectorAll('body *')].filter((el) => el.getBoundingClientRect().right > window.innerWidth + 1)
            .slice(0, 5).map((el) => `${el.tagName.toLowerCase()}.${el.className}`),
        }));
        assert.ok(overflow <= 0, `${name} is ${overflow}px wider than a 390px screen: ${culprits.join(', ')}`);
        await page.screenshot({ path: path.join(outDir, `08-phone-${name.replace(/\W+/g, '-').toLowerCase()}.png`), fullPage: true });
      }
    });
  });

  test('signing in and out works from the keyboard alone', async () => {
    await withPage('09-sign-out', {}, async (page, ctx) => {
      // ?org= (make run prints the console's URL with it) fills in the organization,
      // and the email field has the focus.
      await page.goto(base + '/console/?org=' + encodeURIComponent(ORG));
      await page.getByLabel('Email').waitFor();
      assert.equal(await page.getByLabel('Organization').inputValue(), ORG);
      assert.equal(await page.title(), 'Sign in · Quotaplane console');
      await page.keyboard.type(ADMIN.email);
      await page.keyboard.press('Tab');
      await page.keyboard.type(ADMIN.password);
      await page.keyboard.press('Enter');
      await page.getByRole('heading', { name: 'Overview' }).waitFor();
      // Tab order: the skip link, then the navigation.
      await page.keyboard.press('Tab');
      assert.equal(await page.evaluate(() => document.activeElement.textContent), 'Skip to content');
      await page.keyboard.press('Tab');
      await page.keyboard.press('Tab');
      assert.equal(await page.evaluate(() => document.activeElement.textContent), 'Allocation');
      // Hold the allocation page's user lists until after signing out: a load answered
      // once the session has ended must not surface as a 401 error (it did, in CI).
      const held = [];
      await page.route('**/users?**', (route) => { held.push(route); });
      await page.keyboard.press('Enter');
      await page.getByRole('heading', { name: 'Allocation' }).waitFor();
      for (let i = 0; held.length === 0; i++) {
        assert.ok(i < 100, 'no user list started loading');
        await page.waitForTimeout(50);
      }
      await page.getByRole('button', { name: 'Sign out' }).focus();
      await page.keyboard.press('Enter');
      await page.getByRole('heading', { name: 'Sign in to Quotaplane' }).waitFor();
      await Promise.all(held.map((r) => r.continue().catch(() => {}))); // cancelled ones throw
      await page.unroute('**/users?**');
      await page.waitForTimeout(300); // give a late answer the time to log its error
      assert.equal(await page.evaluate(async () => (await fetch('/console/api/session')).status), 204);
      assert.equal((await ctx.cookies()).filter((c) => c.name === 'qp_session').length, 0);
      await page.reload();
      await page.getByRole('heading', { name: 'Sign in to Quotaplane' }).waitFor();
      // The browser remembers the organization it signed in to.
      await page.goto(base + '/console/');
      await page.getByLabel('Organization').waitFor();
      assert.equal(await page.getByLabel('Organization').inputValue(), ORG);
    });
  });
});
