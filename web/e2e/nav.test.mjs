// End-to-end test of the console's top bar in real headless Chromium, with the harness
// of harness.mjs: at 1280 px and narrower every navigation link, the brand and the
// signed-in user's items lie inside the window, overlap none of the others and are the
// element a click at their centre reaches (a bar that scrolls its links sideways inside
// itself cuts the last ones off), and the page has no horizontal scrollbar. At 1280 px
// it all fits on one row.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import path from 'node:path';
import { launchBrowser, must, outDir, startApi, signIn } from './harness.mjs';

const suffix = randomBytes(4).toString('hex');
const ORG = `nav-${suffix}`;
// A long email, as the spend test's, takes the room it took there.
const ADMIN = { email: `nav-admin-${suffix}@e2e.test`, password: `admin-pw-${suffix}` };

let stack, browser;

before(async () => {
  stack = await startApi('nav', suffix);
  await must(stack.op('POST', '/v1/plans', { id: `plan-nav-${suffix}`, name: 'Nav', fail_mode: 'closed',
    limits: [{ metric: 'requests', window: 'month', limit: 1000 }] }), 201);
  await must(stack.op('POST', '/v1/orgs', { id: ORG, name: 'Nav Labs', plan: `plan-nav-${suffix}` }), 201);
  await must(stack.op('POST', `/v1/orgs/${ORG}/console-users`, { ...ADMIN, role: 'admin' }), 201);
  browser = await launchBrowser();
});

after(async () => {
  await browser?.close();
  await stack?.stop();
});

const overlap = (a, b) => a.x < b.x + b.width && b.x < a.x + a.width && a.y < b.y + b.height && b.y < a.y + a.height;

for (const [width, height] of [[1280, 800], [1024, 768], [800, 600], [390, 844]]) {
  test(`at ${width}x${height} every item of the top bar is inside the window, apart and clickable`, async () => {
    const ctx = await browser.newContext({ viewport: { width, height } });
    const page = await ctx.newPage();
    try {
      await signIn(page, stack.base, ORG, ADMIN);
      const items = await page.evaluate(() => {
        const els = [...document.querySelectorAll('header.top .brand, header.top nav a, header.top .who > *')];
        return els.map((el) => {
          const r = el.getBoundingClientRect();
          const hit = document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2);
          return { name: el.textContent.trim(), nav: !!el.closest('nav'), box: { x: r.x, y: r.y, width: r.width, height: r.height },
            reached: !!hit && el.contains(hit) };
        });
      });
      const links = items.filter((i) => i.nav).map((i) => i.name);
      assert.deepEqual(links, ['Overview', 'Allocation', 'API keys', 'Audit log', 'Billing export', 'Webhooks', 'Mode']);
      for (const { name, box, reached } of items) {
        assert.ok(box.width > 0 && box.height > 0, `${name}: not shown`);
        assert.ok(box.x >= 0 && box.y >= 0 && box.x + box.width <= width && box.y + box.height <= height,
          `${name}: ${JSON.stringify(box)} is not inside the ${width}x${height} window`);
        assert.ok(reached, `${name}: a click at its centre reaches another element (cut off or covered)`);
      }
      for (let i = 0; i < items.length; i++) {
        for (let j = i + 1; j < items.length; j++) {
          assert.ok(!overlap(items[i].box, items[j].box), `${items[i].name} overlaps ${items[j].name}`);
        }
      }
      // At 1280 px the bar has room for everything on one row: every item shares one
      // horizontal band (it wrapped the user's items onto a second row).
      if (width >= 1280) {
        const top = Math.max(...items.map((i) => i.box.y));
        const bottom = Math.min(...items.map((i) => i.box.y + i.box.height));
        assert.ok(top < bottom, `the bar takes more than one row at ${width} px: ${items.map((i) => `${i.name} at y=${Math.round(i.box.y)}`).join(', ')}`);
      }
      const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
      assert.ok(overflow <= 0, `the page scrolls sideways by ${overflow}px`);
      // the last link works: a click on it opens its page
      await page.getByRole('navigation', { name: 'Console' }).getByRole('link', { name: 'Webhooks', exact: true }).click();
      await page.getByRole('heading', { name: 'Webhooks' }).first().waitFor();
      assert.match(page.url(), /\/console\/webhooks$/);
    } finally {
      await page.screenshot({ path: path.join(outDir, `nav-${width}.png`) }).catch(() => {});
      await ctx.close();
    }
  });
}
