// The harness the console's e2e suites share: a quotaplane-api built from this checkout
// (QP_API_BIN, which scripts/e2e.sh sets) on a free port, with a fresh database and the
// shared Redis, an operator token, and Debian's Chromium driven by playwright-core.
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createWriteStream, mkdirSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

export const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
export const outDir = path.join(root, 'test-output', 'e2e');
mkdirSync(outDir, { recursive: true });

const pgBase = new URL(process.env.DATABASE_URL || 'postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable');
export const pgArgs = ['-h', pgBase.hostname, '-p', pgBase.port || '5432', '-U', decodeURIComponent(pgBase.username || 'postgres')];
export const pgEnv = { ...process.env, PGPASSWORD: decodeURIComponent(pgBase.password || '') };

export async function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => { const { port } = s.address(); s.close(() => resolve(port)); });
    s.on('error', reject);
  });
}

// signIn opens the console of org at base and signs in as who ({email, password}),
// then waits for the overview (the sign-in names the org).
export async function signIn(page, base, org, who) {
  await page.goto(base + '/console/?org=' + encodeURIComponent(org));
  await page.getByLabel('Email').fill(who.email);
  await page.getByLabel('Password').fill(who.password);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('heading', { name: 'Overview' }).waitFor();
}

export const must = async (r, want) => { const res = await r; assert.equal(res.status, want, JSON.stringify(res.body)); return res.body; };

// startApi creates the database qp_e2e_<name>_<suffix> and starts the api on it; it
// answers { base, dbName, op, stop }. op(method, path, body, token) calls the API with
// the operator token unless another is given.
export async function startApi(name, suffix) {
  const bin = process.env.QP_API_BIN;
  assert.ok(bin, 'set QP_API_BIN to a built quotaplane-api (scripts/e2e.sh does)');
  const OP = randomBytes(24).toString('hex');
  const dbName = `qp_e2e_${name}_${suffix}`;
  execFileSync('createdb', [...pgArgs, dbName], { env: pgEnv });
  const dbURL = new URL(pgBase);
  dbURL.pathname = '/' + dbName;
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  let log = '';
  const api = spawn(bin, [], {
    env: { ...process.env, DATABASE_URL: dbURL.toString(), REDIS_URL: process.env.REDIS_URL || 'redis://127.0.0.1:6379/0',
      QUOTA_ADMIN_TOKEN: OP, QUOTA_HTTP_ADDR: `127.0.0.1:${port}`, QUOTA_GRPC_ADDR: '127.0.0.1:0', QUOTA_LOG_LEVEL: 'warn' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  api.stdout.on('data', (d) => { log += d; });
  api.stderr.on('data', (d) => { log += d; });
  keepLog(api, name);
  const deadline = Date.now() + 60_000;
  for (;;) {
    try { if ((await fetch(base + '/readyz')).ok) break; } catch { /* not up yet */ }
    if (api.exitCode !== null || Date.now() > deadline) throw new Error(`quotaplane-api did not become ready:\n${log}`);
    await new Promise((r) => setTimeout(r, 200));
  }
  async function op(method, p, body, token = OP) {
    const res = await fetch(base + p, { method, headers: { Authorization: `Bearer ${token}`, 'Content-Type': 'application/json' }, body: body && JSON.stringify(body) });
    const text = await res.text();
    return { status: res.status, body: text ? JSON.parse(text) : undefined };
  }
  async function stop() {
    if (api.exitCode === null) {
      api.kill('SIGTERM');
      await new Promise((r) => { api.once('exit', r); setTimeout(r, 10_000); });
    }
    try { execFileSync('dropdb', [...pgArgs, '--force', '--if-exists', dbName], { env: pgEnv }); } catch (e) { console.error('dropdb:', e.message); }
  }
  return { base, dbName, op, stop };
}

// keepLog copies the api's output to $QP_E2E_LOGS/<name>.log when scripts/e2e.sh sets
// it: the script prints the logs' ends when a test fails (a console error such as an
// unexpected 503 is explained there, not in the browser).
export function keepLog(api, name) {
  const dir = process.env.QP_E2E_LOGS;
  if (!dir) return;
  const out = createWriteStream(path.join(dir, `${name}.log`), { flags: 'a' });
  api.stdout.pipe(out, { end: false });
  api.stderr.pipe(out, { end: false });
}

export function launchBrowser() {
  return chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
  });
}

// brokenWords runs in the page (page.evaluate(brokenWords, { selector, url })): it lists
// every word of the text inside the elements matching selector that the browser laid
// out over two or more lines, as "word (in <the element's text>)". A word is a run of
// non-space characters, and a hyphenated one may break after its hyphens (the pieces
// between them are the words); inside an element matching url (a URL), the pieces
// between the points a URL may break at (after "/", ".", "?", "&", "=", "#", "-") are.
// A word's lines are the distinct tops of the client rectangles of a Range over it.
// Text hidden from sight (.sr-only) is skipped.
export function brokenWords({ selector, url = '.url' }) {
  const out = [];
  for (const root of document.querySelectorAll(selector)) {
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    for (let n = walker.nextNode(); n; n = walker.nextNode()) {
      const el = n.parentElement;
      if (!el || el.closest('.sr-only')) continue;
      const isURL = !!el.closest(url);
      for (const m of n.data.matchAll(/\S+/g)) {
        const pieces = m[0].split(isURL ? /(?<=[/.?&=#-])(?!\/)/ : /(?<=-)/);
        let at = m.index;
        for (const p of pieces) {
          const r = document.createRange();
          r.setStart(n, at);
          r.setEnd(n, at + p.length);
          const lines = new Set([...r.getClientRects()].filter((x) => x.width > 0).map((x) => Math.round(x.top)));
          if (lines.size > 1) out.push(`${p} (in "${root.textContent.replace(/\s+/g, ' ').trim().slice(0, 80)}")`);
          at += p.length;
        }
      }
    }
  }
  return out;
}
