-- Issue 29: the worker's flush lists the orgs with a Redis of their own once a minute
-- (tenants.Service.DedicatedOrgs); a partial index makes that read as long as the
-- list, not the orgs table (100,000 orgs: a sequential scan of ~150 ms).
BEGIN;
CREATE INDEX orgs_dedicated_redis_idx ON orgs (id) WHERE redis_url <> '';
COMMIT;
