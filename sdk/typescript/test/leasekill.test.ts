// Issue 43's exactness for the TypeScript client: two Node processes with leases on
// one user's month limit, one killed with SIGKILL mid-load. Nothing is admitted past
// the limit; once the killed process's leases are past settle_by and the worker's
// sweep committed them, what is counted covers what was admitted, and exceeds it by
// at most the killed process's outstanding lease units (a lease is counted whole when
// its holder dies) plus the checks it had sent and not yet seen answered.
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { fileURLToPath } from "node:url";
import { after, before, it } from "node:test";

import { QuotaplaneClient } from "../src/index.js";
import { Stack } from "./harness.js";

let stack: Stack;
before(async () => {
  stack = await Stack.start({ worker: true });
});
after(async () => {
  await stack?.stop();
});

const workers = 2;

// Child follows one leasechild.js process from its lines.
class Child {
  readonly proc: ChildProcess;
  admitted = 0;
  leased = 0;
  sent = 0; // checks sent to the server
  readonly open = new Map<string, { units: number; settleBy: number; used?: number }>(); // leases not yet settled
  closed = false;
  exited: Promise<number | null>;
  #rest = "";
  stderr = "";

  constructor(env: Record<string, string>, onLine: (c: Child, line: string) => void) {
    const script = fileURLToPath(new URL("./leasechild.js", import.meta.url));
    this.proc = spawn(process.execPath, [script], { env: { ...process.env, ...env, QP_WORKERS: String(workers) }, stdio: ["ignore", "pipe", "pipe"] });
    this.exited = new Promise((resolve) => this.proc.once("exit", (code) => resolve(code)));
    this.proc.stderr!.on("data", (b: Buffer) => (this.stderr += b.toString()));
    this.proc.stdout!.on("data", (b: Buffer) => {
      const lines = (this.#rest + b.toString()).split("\n");
      this.#rest = lines.pop()!;
      for (const line of lines) {
        this.#line(line);
        onLine(this, line);
      }
    });
  }

  #line(line: string): void {
    const [k, a, b, c] = line.split(" ");
    if (k === "a") {
      this.admitted++;
      if (a === "L") this.leased++;
    } else if (k === "s") this.sent++;
    else if (k === "t") this.open.set(a!, { units: Number(b), settleBy: Date.parse(c!) });
    else if (k === "c") this.open.get(a!)!.used = Number(b);
    else if (k === "d") this.open.delete(a!);
    else if (k === "closed") this.closed = true;
  }
}

async function userLevel(org: string, user: string): Promise<{ used: number; reserved: number }> {
  const period = new Date().toISOString().slice(0, 7);
  const u = await stack.api_("GET", `/v1/orgs/${org}/usage?period=${period}`);
  const m = (u.metrics as any[]).find((x) => x.metric === "requests");
  const l = (m?.users as any[] | undefined)?.find((x) => x.id === user);
  return { used: l?.used ?? 0, reserved: l?.reserved ?? 0 };
}

it("two processes with leases, one killed -9 mid-load: admitted <= limit, counted - admitted <= the killed one's outstanding leases", { timeout: 180_000 }, async () => {
  const limit = 30_000;
  const { org, key } = await stack.org({ limits: [{ metric: "requests", window: "month", limit: 10_000_000 }] });
  await stack.api_("POST", `/v1/orgs/${org}/teams`, { id: "eng", name: "eng", user_limits: [{ metric: "requests", window: "month", limit }] });
  const env = { QP_URL: stack.baseUrl, QP_KEY: key, QP_ORG: org, QP_TEAM: "eng", QP_USER: "alice" };
  let killedAt: { admitted: number; open: { id: string; units: number; used?: number }[] } | undefined;
  const onLine = (c: Child, line: string) => {
    // Kill A at a quarter of the limit, just after it admitted from an open lease.
    if (killedAt === undefined && c === a && line === "a L" && c.admitted >= limit / 4) {
      a.proc.kill("SIGKILL");
      killedAt = { admitted: c.admitted, open: [...c.open].map(([id, l]) => ({ id, units: l.units, used: l.used })) };
    }
  };
  const a: Child = new Child(env, onLine);
  const b = new Child(env, onLine);
  const codeA = await a.exited;
  assert.ok(killedAt, `A exited (${codeA}) before it was killed:\n${a.stderr}`);
  const codeB = await b.exited;
  assert.equal(codeB, 0, `B failed:\n${b.stderr}`);
  assert.ok(b.closed, "B closed its client");
  const aEnd = Math.max(0, ...[...a.open.values()].map((l) => l.settleBy));
  // B is done and closed: what is held now is A's (its leases, counted whole at settle_by).
  const heldAtBEnd = await userLevel(org, "alice");
  const measuredHeld = Date.now() < aEnd;
  const admitted = a.admitted + b.admitted;
  console.log(
    `killed A at ${killedAt.admitted} admitted; its lines: admitted ${a.admitted} (${a.leased} leased), leases unsettled at kill ${JSON.stringify(killedAt.open)}, ` +
      `B: admitted ${b.admitted} (${b.leased} leased); held after B closed ${heldAtBEnd.reserved}` +
      (measuredHeld ? "" : " (measured after A's settle_by)"),
  );
  assert.ok(admitted <= limit, `admitted ${admitted} > limit ${limit}`);

  // The worker sweeps reservations every 500 ms: wait until A's leases are past
  // settle_by and nothing is held.
  const deadline = Date.now() + 60_000;
  let lvl = heldAtBEnd;
  while (Date.now() < aEnd + 600 || lvl.reserved > 0) {
    assert.ok(Date.now() < deadline, `still held after 60 s: ${JSON.stringify(lvl)}`);
    await new Promise((r) => setTimeout(r, 250));
    lvl = await userLevel(org, "alice");
  }
  const probe = new QuotaplaneClient({ baseUrl: stack.baseUrl, key });
  const counted = (await probe.check({ org, team: "eng", user: "alice", cost: 0 })).result!.levels.find((l) => l.level === "user")!.used;
  assert.equal(counted, lvl.used, "the check's and the usage API's count agree");
  // The bound: A's outstanding lease units (the server's held units once B closed,
  // else what A reported taken and not settled), plus A's checks in flight (at most
  // its loops: each sends one at a time).
  const outstanding = measuredHeld ? heldAtBEnd.reserved : [...a.open.values()].reduce((s, l) => s + l.units, 0);
  const bound = outstanding + workers;
  console.log(`limit ${limit}, admitted ${admitted}, counted ${counted}, counted - admitted ${counted - admitted}, bound ${bound} (outstanding lease units ${outstanding} + ${workers} checks in flight)`);
  assert.ok(counted >= admitted, `counted ${counted} < admitted ${admitted}`);
  assert.ok(counted - admitted <= bound, `counted - admitted ${counted - admitted} > bound ${bound}`);
  assert.ok(a.leased > 0 && b.leased > 0, "both processes admitted from leases");
});
