-- Entitlements (issue 25): a plan's features, name -> a boolean, an integer or a
-- string, and an org's overrides of them (the operator's), where a JSON null removes
-- the plan's feature for that org. Both are JSON objects validated by the service
-- (tenants.ValidateFeatures: at most 64 names of a bounded pattern, bounded values).
BEGIN;
ALTER TABLE plans ADD COLUMN features jsonb NOT NULL DEFAULT '{}';
ALTER TABLE orgs ADD COLUMN feature_overrides jsonb NOT NULL DEFAULT '{}';
COMMIT;
