BEGIN;
ALTER TABLE usage_counters DROP COLUMN adjusted_at;
COMMIT;
