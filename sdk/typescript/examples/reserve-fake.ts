// reserveMiddleware against FakeQuotaplane: the handler streams and reports its tokens
// as it goes (reportUsage adds); the reservation is committed with their sum when the
// handler is done.
import type { AddressInfo } from "node:net";

import express from "express";

import { reportUsage, reserveMiddleware } from "../src/index.js";
import { FakeQuotaplane } from "../src/testing.js";
import type { Settled } from "../src/index.js";

const quota = new FakeQuotaplane();
let settle: (s: Settled) => void = () => {};
const settled = new Promise<Settled>((resolve) => (settle = resolve));
const app = express();
app.post(
  "/chat",
  reserveMiddleware(quota, {
    reserve: () => ({ org: "acme", metric: "tokens", amount: 4000 }),
    onSettled: (s) => settle(s),
  }),
  async (_req, res) => {
    for (const chunk of ["Hello", ", ", "world"]) {
      res.write(chunk);
      reportUsage(res, chunk.length);
    }
    res.end();
  },
);

const srv = app.listen(0, "127.0.0.1", async () => {
  const res = await fetch(`http://127.0.0.1:${(srv.address() as AddressInfo).port}/chat`, { method: "POST" });
  console.log(res.status, await res.text());
  const s = await settled;
  console.log("settled:", s.ending, s.result?.state, "used", s.result?.used, "released", s.result?.released);
  console.log(quota.calls.map((c) => c.operation).join(" "));
  srv.close();
});

// Output:
// 200 Hello, world
// settled: finished committed used 12 released 3988
// reserve commit
