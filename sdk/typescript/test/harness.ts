// The tests' Quotaplane: quotaplane-api (and, when asked, quotaplane-worker) built
// from this checkout and started on a Postgres database of their own, on the Redis of
// REDIS_URL; every test makes its own plan and org with random ids, so nothing it
// counts is seen by another test or another run.
import { execFileSync, spawn, spawnSync, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

export const repoRoot = (() => {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, "go.mod")) || !existsSync(join(dir, "cmd", "api"))) {
    const up = dirname(dir);
    if (up === dir) throw new Error("harness: the repository root (go.mod, cmd/api) is not above " + fileURLToPath(import.meta.url));
    dir = up;
  }
  return dir;
})();

export function randomId(prefix: string): string {
  return `${prefix}-${randomBytes(5).toString("hex")}`;
}

/**
 * The binary `name` (quotaplane-api, quotaplane-worker) built from this checkout into
 * build/bin: go build relinks only what changed, so each test file gets a fresh one
 * in about a second once the first has built it. (npm test runs the files one at a
 * time, so no two builds write the same file at once.)
 */
export function binary(name: "quotaplane-api" | "quotaplane-worker"): string {
  const path = fileURLToPath(new URL(`../bin/${name}`, import.meta.url));
  if (!built.has(name)) {
    const pkg = name === "quotaplane-api" ? "./cmd/api" : "./cmd/worker";
    execFileSync("go", ["build", "-o", path, pkg], { cwd: repoRoot, stdio: ["ignore", "inherit", "inherit"] });
    built.add(name);
  }
  return path;
}
const built = new Set<string>();

/** A free TCP port on the loopback interface. */
export async function freePort(): Promise<number> {
  const srv = createServer();
  await new Promise<void>((resolve) => srv.listen(0, "127.0.0.1", resolve));
  const addr = srv.address();
  await new Promise<void>((resolve) => srv.close(() => resolve()));
  if (addr === null || typeof addr === "string") throw new Error("harness: no port");
  return addr.port;
}

/** The environment without the binaries' own settings, so a developer's cannot leak in. */
function cleanEnv(): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (v === undefined || k.startsWith("QUOTA_") || k === "DATABASE_URL" || k === "REDIS_URL" || k === "REDIS_CLUSTER") continue;
    out[k] = v;
  }
  return out;
}

export interface Proc {
  readonly child: ChildProcess;
  /** Its stderr and stdout so far. */
  log(): string;
  /** Stops it with SIGTERM (SIGKILL after 10 s) and waits for it to exit. */
  stop(): Promise<void>;
}

function run(path: string, env: Record<string, string>): Proc {
  const child = spawn(path, [], { env, stdio: ["ignore", "pipe", "pipe"] });
  let log = "";
  child.stdout?.on("data", (b: Buffer) => (log += b.toString()));
  child.stderr?.on("data", (b: Buffer) => (log += b.toString()));
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  return {
    child,
    log: () => log,
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.kill("SIGTERM");
      const timer = setTimeout(() => child.kill("SIGKILL"), 10_000);
      await exited;
      clearTimeout(timer);
    },
  };
}

async function waitFor(url: string, proc: Proc, what: string): Promise<void> {
  const deadline = Date.now() + 60_000;
  let last = "";
  while (Date.now() < deadline) {
    if (proc.child.exitCode !== null) throw new Error(`harness: ${what} exited (${proc.child.exitCode}):\n${proc.log()}`);
    try {
      const res = await fetch(url, { signal: AbortSignal.timeout(2000) });
      if (res.status === 200) return;
      last = `answered ${res.status}`;
    } catch (err) {
      last = String(err);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`harness: ${what} not ready at ${url}: ${last}\n${proc.log()}`);
}

export interface StackOptions {
  /** Start quotaplane-worker too (webhooks, persisted usage). */
  worker?: boolean;
  /**
   * Seed the demo org as `make run` does (demoKey is its key) on this database of the
   * test Redis (1 to 15), flushed first: the demo's ids are fixed, so it cannot share
   * a keyspace. Like testenv.StartStack, the stack holds Postgres advisory lock
   * 7272000 + demoRedisDB until it stops, so one run at a time uses that database.
   */
  demoRedisDB?: number;
}

const stackLockBase = 7272000; // testenv.StartStack's

/** Holds a Postgres advisory lock through a psql session until release is called. */
async function advisoryLock(adminUrl: string, id: number): Promise<() => void> {
  const psql = spawn("psql", [adminUrl, "-X", "-q", "-t", "-A"], { stdio: ["pipe", "pipe", "pipe"] });
  let out = "";
  await new Promise<void>((resolve, reject) => {
    psql.stdout.on("data", (b: Buffer) => {
      out += b.toString();
      if (out.includes("locked")) resolve();
    });
    psql.once("exit", (code) => reject(new Error(`harness: psql exited (${code}) before taking lock ${id}`)));
    psql.once("error", reject);
    psql.stdin.write(`SELECT pg_advisory_lock(${id}); SELECT 'locked';\n`);
  });
  return () => psql.stdin.end();
}

/** A running Quotaplane on a fresh database. */
export class Stack {
  readonly baseUrl: string;
  readonly operatorToken: string;
  readonly webhookSecret: string;
  readonly databaseUrl: string;
  readonly redisUrl: string;
  readonly api: Proc;
  readonly worker: Proc | undefined;
  /** The demo org's key, when the stack seeded it. */
  demoKey = "";
  #unlock: () => void = () => {};
  readonly #extra: Proc[] = [];
  readonly #dbName: string;
  readonly #adminUrl: string;

  private constructor(fields: {
    baseUrl: string;
    operatorToken: string;
    webhookSecret: string;
    databaseUrl: string;
    redisUrl: string;
    api: Proc;
    worker: Proc | undefined;
    dbName: string;
    adminUrl: string;
  }) {
    this.baseUrl = fields.baseUrl;
    this.operatorToken = fields.operatorToken;
    this.webhookSecret = fields.webhookSecret;
    this.databaseUrl = fields.databaseUrl;
    this.redisUrl = fields.redisUrl;
    this.api = fields.api;
    this.worker = fields.worker;
    this.#dbName = fields.dbName;
    this.#adminUrl = fields.adminUrl;
  }

  /** Builds the binaries (once per process) and starts them; resolves once the api's /readyz answers 200. */
  static async start(opts: StackOptions = {}): Promise<Stack> {
    const admin = new URL(process.env.DATABASE_URL || "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable");
    const dbName = `qp_ts_${randomBytes(5).toString("hex")}`;
    const db = new URL(admin.href);
    db.pathname = `/${dbName}`; // the api creates and migrates it at start
    let redisUrl = process.env.REDIS_URL || "redis://127.0.0.1:6379/0";
    let unlock = () => {};
    if (opts.demoRedisDB !== undefined) {
      const u = new URL(redisUrl);
      u.pathname = `/${opts.demoRedisDB}`;
      redisUrl = u.href;
      unlock = await advisoryLock(admin.href, stackLockBase + opts.demoRedisDB);
      execFileSync("redis-cli", ["-u", redisUrl, "flushdb"], { stdio: "ignore" });
    }
    const operatorToken = `ts-op-${randomBytes(12).toString("hex")}`;
    const webhookSecret = `ts-webhook-${randomBytes(12).toString("hex")}`;
    const apiAddr = `127.0.0.1:${await freePort()}`;
    const env = {
      ...cleanEnv(),
      DATABASE_URL: db.href,
      REDIS_URL: redisUrl,
      QUOTA_ADMIN_TOKEN: operatorToken,
      QUOTA_WEBHOOK_SECRET: webhookSecret,
      QUOTA_LOG_LEVEL: "warn",
      QUOTA_STARTUP_TIMEOUT: "20s",
      QUOTA_FLUSH_INTERVAL: "200ms",
      QUOTA_WEBHOOK_ALLOW_PRIVATE: "true",
      // A machine busy with other builds can stall Redis past the 100 ms default.
      QUOTA_REDIS_TIMEOUT: "2s",
    };
    let demoKey = "";
    if (opts.demoRedisDB !== undefined) {
      const state = mkdtempSync(join(tmpdir(), "quotaplane-sdk-demo-"));
      try {
        execFileSync(binary("quotaplane-api"), ["demo", "--state-dir", state], { env, stdio: "pipe" });
        demoKey = readFileSync(join(state, "demo-org-key"), "utf8").trim();
      } catch (err) {
        unlock();
        throw err;
      } finally {
        rmSync(state, { recursive: true, force: true });
      }
    }
    // The api first: it creates and migrates the database the worker then uses.
    const api = run(binary("quotaplane-api"), { ...env, QUOTA_HTTP_ADDR: apiAddr, QUOTA_GRPC_ADDR: "127.0.0.1:0" });
    let worker: Proc | undefined;
    const s = new Stack({ baseUrl: `http://${apiAddr}`, operatorToken, webhookSecret, databaseUrl: db.href, redisUrl, api, worker, dbName, adminUrl: admin.href });
    s.demoKey = demoKey;
    s.#unlock = unlock;
    try {
      await waitFor(`http://${apiAddr}/readyz`, api, "quotaplane-api");
      if (opts.worker) {
        const workerAddr = `127.0.0.1:${await freePort()}`;
        worker = run(binary("quotaplane-worker"), { ...env, QUOTA_WORKER_HTTP_ADDR: workerAddr });
        (s as { worker: Proc | undefined }).worker = worker;
        await waitFor(`http://${workerAddr}/healthz`, worker, "quotaplane-worker");
      }
    } catch (err) {
      await s.stop();
      throw err;
    }
    return s;
  }

  /**
   * Starts another quotaplane-api on this stack's database with `env` on top of its
   * settings (another REDIS_URL, say), and resolves once `ready` answers 200.
   */
  async startAPI(env: Record<string, string>, ready = "/healthz"): Promise<{ baseUrl: string; proc: Proc }> {
    const addr = `127.0.0.1:${await freePort()}`;
    const proc = run(binary("quotaplane-api"), {
      ...cleanEnv(),
      DATABASE_URL: this.databaseUrl,
      REDIS_URL: this.redisUrl,
      QUOTA_ADMIN_TOKEN: this.operatorToken,
      QUOTA_LOG_LEVEL: "warn",
      QUOTA_HTTP_ADDR: addr,
      QUOTA_GRPC_ADDR: "127.0.0.1:0",
      ...env,
    });
    this.#extra.push(proc);
    await waitFor(`http://${addr}${ready}`, proc, "the second quotaplane-api");
    return { baseUrl: `http://${addr}`, proc };
  }

  /** Stops every process and drops the database. */
  async stop(): Promise<void> {
    await Promise.all([...this.#extra, this.api, ...(this.worker ? [this.worker] : [])].map((p) => p.stop()));
    spawnSync("psql", [this.#adminUrl, "-q", "-c", `DROP DATABASE IF EXISTS ${this.#dbName} WITH (FORCE)`], { stdio: "ignore" });
    this.#unlock();
  }

  /** Calls the API with the operator token (or `token`), failing on any status but `want`. */
  async api_(method: string, path: string, body?: unknown, token = this.operatorToken, want = [200, 201, 204]): Promise<any> {
    const res = await fetch(this.baseUrl + path, {
      method,
      headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    if (!want.includes(res.status)) throw new Error(`${method} ${path}: ${res.status} ${text}`);
    return text ? JSON.parse(text) : undefined;
  }

  /**
   * A plan with `limits` and an org on it, with an org key of scopes check, admin and
   * billing: fresh ids, so each test counts alone.
   */
  async org(opts: { limits: { metric: string; window: string; limit: number; burst?: number }[]; failMode?: "open" | "closed" | "local"; metered?: string[] }): Promise<{ org: string; key: string }> {
    const plan = randomId("plan");
    const org = randomId("org");
    await this.api_("POST", "/v1/plans", { id: plan, name: plan, fail_mode: opts.failMode ?? "closed", limits: opts.limits, ...(opts.metered ? { metered: opts.metered } : {}) });
    await this.api_("POST", "/v1/orgs", { id: org, name: org, plan });
    const key = await this.api_("POST", `/v1/orgs/${org}/api-keys`, { name: "sdk-test", scopes: ["check", "admin", "billing"] });
    if (opts.limits.some((l) => l.window === "minute")) await clearOfMinuteEdge();
    return { org, key: key.secret as string };
  }
}

// clearOfMinuteEdge waits, when fewer than 10 s of the current minute are left, for the
// next minute to begin. A sliding minute window weighs the previous bucket by the part of
// it still inside the window, rounded down: a unit counted just before a minute ends
// weighs 0 just after it, so a test that counts exact remaining units across the edge
// sees one more (CI saw RateLimit-Remaining 1 where 0 was due).
export async function clearOfMinuteEdge(): Promise<void> {
  const left = 60_000 - (Date.now() % 60_000);
  if (left < 10_000) await new Promise((r) => setTimeout(r, left + 50));
}

/**
 * A level reference (`blocked_at`) without its `metric`, which a server with
 * several-metric decisions adds: the tests of one metric compare the rest.
 */
export function withoutMetric(ref: unknown): unknown {
  if (typeof ref !== "object" || ref === null || !("metric" in ref)) return ref;
  const { metric: _metric, ...rest } = ref as Record<string, unknown>;
  return rest;
}
