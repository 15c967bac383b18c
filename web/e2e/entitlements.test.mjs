// End-to-end tests of issue 25's console views in real headless Chromium, with the
// harness of harness.mjs (a quotaplane-api built from this checkout on a free port, a
// fresh database, the shared Redis):
//   - the Entitlements page shows the plan's features with the operator's overrides,
//     read-only, as GET /v1/entitlements resolves them;
//   - spend is shown as money ("2.50 USD of 500.00") on the overview and the allocation
//     page: a plan with a rate card and a monthly spend budget, and a check that spends,
//     all through the API, and the allocation page's first line names the budget as
//     money;
//   - the limits editor shows a spend limit as money ("10.00 USD"), takes an amount and
//     sends micro-units.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import path from 'node:path';
import { launchBrowser, must, outDir, startApi, signIn } from './harness.mjs';

const suffix = randomBytes(4).toString('hex');
const ORG = `ent-${suffix}`;
const PLAN = `plan-ent-${suffix}`;
const ADMIN = { email: `ent-admin-${suffix}@e2e.test`, password: `admin-pw-${suffix}` };

let stack, op, browser;

before(async () => {
  stack = await startApi('ent', suffix);
  op = stack.op;
  const plan = {
    id: PLAN, name: 'AI platform', fail_mode: 'closed',
    limits: [{ metric: 'requests', window: 'month', limit: 100000 }, { metric: 'tokens', window: 'month', limit: 100000000 },
      { metric: 'spend', window: 'month', limit: 500000000 }], // a 500 USD monthly budget
    features: { sso: true, seats: 25, tier: 'gold', audit_export: true },
  };
  await must(op('POST', '/v1/plans', { ...plan, currency: 'USD', rates: [{ metric: 'tokens', price: '2.50', per: 1000000 }] }), 201);
  await must(op('POST', '/v1/orgs', { id: ORG, name: 'Research Labs', plan: PLAN }), 201);
  await must(op('POST', `/v1/orgs/${ORG}/teams`, { id: 'research', name: 'Research',
    limits: [{ metric: 'spend', window: 'month', limit: 200000000 }], user_limits: [{ metric: 'spend', window: 'month', limit: 10000000 }] }), 201);
  await must(op('PUT', `/v1/orgs/${ORG}/features`, { features: { seats: 50, audit_export: null, region: 'eu-west' } }), 200);
  await must(op('POST', `/v1/orgs/${ORG}/console-users`, { ...ADMIN, role: 'admin' }), 201);
  browser = await launchBrowser();
});

after(async () => {
  await browser?.close();
  await stack?.stop();
});

async function withPage(name, fn) {
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await ctx.newPage();
  const problems = [];
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => { if (m.type() === 'error') problems.push(`console error: ${m.text()}`); });
  try {
    await signIn(page, stack.base, ORG, ADMIN);
    await fn(page);
  } finally {
    await page.screenshot({ path: path.join(outDir, `${name}.png`), fullPage: true }).catch(() => {});
    await ctx.close();
  }
  assert.deepEqual(problems, [], `${name}: console errors`);
}

test('the Entitlements page shows the resolved features, read-only, as GET /v1/entitlements does', async () => {
  const key = (await must(op('POST', `/v1/orgs/${ORG}/api-keys`, { name: 'svc', scopes: ['check'] }), 201)).secret;
  const resolved = await must(op('GET', `/v1/entitlements?org=${ORG}&team=research`, undefined, key), 200);
  assert.deepEqual(resolved.features, { sso: true, seats: 50, tier: 'gold', region: 'eu-west' });
  await withPage('console-entitlements', async (page) => {
    await page.getByTestId('entitlements-link').click(); // from the overview's plan card: the navigation bar is full
    await page.getByRole('heading', { name: 'Entitlements' }).waitFor();
    assert.match(page.url(), /\/console\/entitlements$/);
    assert.equal(await page.getByTestId('features-plan').textContent(), PLAN);
    for (const [name, value] of Object.entries(resolved.features)) {
      const want = value === true ? 'yes' : typeof value === 'number' ? value.toLocaleString('en-US') : value;
      assert.equal(await page.getByTestId(`feature-value-${name}`).textContent(), want, name);
      assert.equal(await page.getByTestId(`feature-source-${name}`).textContent(), resolved.sources[name] === 'org' ? 'org override' : 'plan', name);
    }
    assert.equal(await page.getByTestId('feature-value-audit_export').textContent(), 'removed for this org');
    assert.equal(await page.getByTestId('features').locator('input, button').count(), 0, 'read-only');
  });
});

test('spend is shown as money on the overview and the allocation page', async () => {
  const key = (await must(op('POST', `/v1/orgs/${ORG}/api-keys`, { name: 'llm', scopes: ['check'] }), 201)).secret;
  // 1,000,000 tokens at 2.50 USD per 1,000,000: 2.50 USD = 2,500,000 micro-units, at every level.
  await must(op('POST', '/v1/check', { org: ORG, team: 'research', user: 'ada', costs: { requests: 1, tokens: 1000000 } }, key), 200);
  const usage = await must(op('GET', `/v1/orgs/${ORG}/usage`), 200);
  const spend = usage.metrics.find((m) => m.metric === 'spend');
  assert.equal(spend?.currency, 'USD', 'the usage of spend names its currency');
  assert.equal(spend.org.used, 2500000);
  await withPage('console-spend', async (page) => {
    const panel = page.getByTestId('metric-spend');
    await panel.waitFor();
    assert.match(await panel.textContent(), /2\.50 USD of 500\.00/);
    await page.getByRole('navigation', { name: 'Console' }).getByRole('link', { name: 'Allocation', exact: true }).click();
    const team = page.getByTestId('alloc-row-team-research-spend-month');
    await team.waitFor();
    assert.match(await team.textContent(), /2\.50 USD of 200\.00/);
    assert.match(await page.getByTestId('alloc-row-user-research/ada-spend-month').textContent(), /2\.50 USD of 10\.00/);
    // the page's first line names the org's budget as money, not micro-units
    assert.match(await page.locator('p.muted', { hasText: "The org's month limits" }).textContent(), /spend 500\.00 USD/);
    assert.match(await page.getByTestId('org-used-spend').textContent(), /^2\.50 USD/);
  });
});

test('a spend limit is shown and edited as money, and sent as micro-units', async () => {
  await withPage('console-spend-edit', async (page) => {
    await page.getByRole('navigation', { name: 'Console' }).getByRole('link', { name: 'Allocation', exact: true }).click();
    await page.getByTestId('alloc-row-team-research-spend-month').waitFor(); // usage, which names the currency, has loaded
    const edit = page.getByRole('button', { name: 'Edit spend per month limit of User defaults of research' });
    assert.equal(await edit.textContent(), '10.00 USD');
    assert.equal(await page.getByRole('button', { name: 'Edit spend per month limit of Team research' }).textContent(), '200.00 USD');
    await edit.click();
    const input = page.getByLabel('spend per month limit in USD');
    assert.equal(await input.inputValue(), '10.00');
    await input.fill('12.345678');
    await page.getByRole('button', { name: 'Save' }).click();
    await page.getByRole('button', { name: 'Edit spend per month limit of User defaults of research' }).filter({ hasText: '12.345678 USD' }).waitFor();
    const team = await must(op('GET', `/v1/orgs/${ORG}/teams/research`), 200);
    assert.deepEqual(team.user_limits, [{ metric: 'spend', window: 'month', limit: 12345678 }]);
  });
});
