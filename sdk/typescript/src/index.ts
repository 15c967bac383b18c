/**
 * Quotaplane's client for TypeScript and JavaScript: checks and reservations over
 * fetch with retries that never count twice and a fail policy, (req, res, next)
 * middleware for Express and similar routers, and webhook signature verification.
 * The API's types are generated from api/openapi.yaml into schema.d.ts.
 */
export * from "./client.js";
export * from "./entitlements.js";
export * from "./errors.js";
export type { LeaseEvent } from "./leases.js";
export * from "./middleware.js";
export * from "./ratelimit.js";
export * from "./webhook.js";
export { VERSION } from "./version.js";
export type { components, paths, operations } from "./schema.js";
