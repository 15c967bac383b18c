// noopQuotaplane allows everything and counts nothing: for a development server, or
// tests that are not about quotas.
import { noopQuotaplane } from "../src/testing.js";

const quota = noopQuotaplane();
const out = await quota.check({ org: "acme", user: "alice", cost: 1_000_000 });
console.log(out.allowed, out.decidedBy);
const r = await quota.reserve({ org: "acme", metric: "tokens", amount: 4000 });
console.log(r.allowed, r.reservation?.state, (await quota.commit(r.reservation!.id, 1200)).state);

// Output:
// true quotaplane
// true held committed
