// Entitlements: the org's resolved features, as GET /v1/entitlements answers them;
// QuotaplaneClient's entitlements, feature and entitled call it.
import type { components } from "./schema.js";

/** An org's resolved features and where each comes from ("plan", or "org": an override). */
export type Entitlements = components["schemas"]["Entitlements"];

/** A feature's value: a boolean, an integer (exact: at most 2^53-1 in magnitude) or a string. */
export type FeatureValue = components["schemas"]["FeatureValue"];

/** Whether a feature's value grants it: present and not false, 0 or "" (as the Go client's Entitled). */
export function grants(value: FeatureValue | undefined): boolean {
  return value !== undefined && value !== false && value !== 0 && value !== "";
}

/** The query of GET /v1/entitlements. */
export function entitlementsPath(org: string, team?: string, user?: string): string {
  const q = new URLSearchParams({ org });
  if (team) q.set("team", team);
  if (user) q.set("user", user);
  return `/v1/entitlements?${q}`;
}
