BEGIN;
ALTER TABLE orgs DROP COLUMN sliding_windows;
ALTER TABLE plans DROP COLUMN sliding_windows;
COMMIT;
