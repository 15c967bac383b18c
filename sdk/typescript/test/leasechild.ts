// A client process of leasekill.test.ts: checks one path with leases on, `QP_WORKERS`
// loops at once, until it has been denied for a while, then closes and exits. It tells
// the parent, one line each, written synchronously before anything else happens:
//   "a L" / "a S"              a check admitted (from a lease / by the server)
//   "s"                        a check is about to be sent to the server
//   "t <id> <units> <settle_by>", "c <id> <used>", "d <id> <used>", "f <id>"
//                              a lease taken, closed, settled, its settle failed
//   "u"                        a check the client's fail policy refused
//   "closed"                   close() returned
import { writeSync } from "node:fs";

import { QuotaplaneClient } from "../src/index.js";

const env = (k: string): string => {
  const v = process.env[k];
  if (!v) throw new Error(`leasechild: ${k} is not set`);
  return v;
};
const say = (line: string) => writeSync(1, line + "\n");

const client = new QuotaplaneClient({
  baseUrl: env("QP_URL"),
  key: env("QP_KEY"),
  leases: true,
  failPolicy: "closed",
  budgetMs: 5000,
  onLease: (e) => {
    if (e.event === "taken") say(`t ${e.id} ${e.units} ${e.settleBy}`);
    else if (e.event === "closed") say(`c ${e.id} ${e.used}`);
    else if (e.event === "settled") say(`d ${e.id} ${e.used}`);
    else if (e.event === "failed" && e.id) say(`f ${e.id}`);
  },
  fetch: (input, init) => {
    if (String(input).endsWith("/v1/check")) say("s");
    return fetch(input, init);
  },
});
const req = { org: env("QP_ORG"), team: env("QP_TEAM"), user: env("QP_USER") };
let firstDenied = 0;
let denied = 0;
async function loop(): Promise<void> {
  for (;;) {
    const out = await client.check(req);
    if (out.allowed) {
      say(out.leased ? "a L" : "a S");
      continue;
    }
    if (out.decidedBy !== "quotaplane") {
      say("u"); // not decided (a loaded machine can spend a check's budget): admitted nothing
      continue;
    }
    denied++;
    if (firstDenied === 0) firstDenied = performance.now();
    if (denied >= 20 && performance.now() - firstDenied > 500) return;
  }
}
await Promise.all(Array.from({ length: Number(process.env.QP_WORKERS ?? "2") }, loop));
await client.close();
say("closed");
