-- Metrics a plan meters without a limit: checks of them are counted in usage and
-- billed, never denied. With the metrics named by the plan's limits, its pricing and
-- an org's overrides they make the metrics an org knows; a check of any other metric
-- is refused (422), so a typo is not billed. Ids are validated by the service.
BEGIN;
ALTER TABLE plans ADD COLUMN metered text[] NOT NULL DEFAULT '{}';
COMMIT;
