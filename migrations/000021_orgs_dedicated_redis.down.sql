BEGIN;
DROP INDEX IF EXISTS orgs_dedicated_redis_idx;
COMMIT;
