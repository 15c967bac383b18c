// An Express app's quota, tested without Quotaplane: FakeQuotaplane (from
// "@quotaplane/client/testing") allows 2 requests per user, then denies; the handler
// reads the decision on req.quotaplane.
import type { AddressInfo } from "node:net";

import express from "express";

import { checkMiddleware } from "../src/index.js";
import { FakeQuotaplane } from "../src/testing.js";

const quota = new FakeQuotaplane({ limit: 2 });
const app = express();
app.get(
  "/work",
  checkMiddleware(quota, { check: (req: express.Request) => ({ org: "acme", user: req.get("X-User") }) }),
  (req: express.Request, res) => void res.json({ decidedBy: req.quotaplane?.decidedBy }),
);

const srv = app.listen(0, "127.0.0.1", async () => {
  const url = `http://127.0.0.1:${(srv.address() as AddressInfo).port}/work`;
  for (const user of ["alice", "alice", "alice", "bob"]) {
    const res = await fetch(url, { headers: { "X-User": user } });
    console.log(user, res.status, res.status === 200 ? JSON.stringify(await res.json()) : res.headers.get("Retry-After"));
  }
  console.log("checks sent:", quota.calls.length, "alice used:", quota.used({ org: "acme", user: "alice" }));
  srv.close();
});

// Output:
// alice 200 {"decidedBy":"quotaplane"}
// alice 200 {"decidedBy":"quotaplane"}
// alice 429 1
// bob 200 {"decidedBy":"quotaplane"}
// checks sent: 4 alice used: 2
