BEGIN;
ALTER TABLE orgs DROP COLUMN feature_overrides;
ALTER TABLE plans DROP COLUMN features;
COMMIT;
