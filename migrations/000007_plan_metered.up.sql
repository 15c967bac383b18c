-- Metrics a plan meters without a limit: checks of them are counted in usage and
-- billed, never denied. With the metrics named by the plan's limits, its pricing and
-- an org's overrides they make the metrics an org knows; a check of any other metric
-- is refused (422), so a typo is not billed. Ids are validated by the service.
--
-- Existing allocations stay valid: a metric that teams or users of a plan's orgs
-- allocate, and that the plan names neither in its limits nor in its pricing, is
-- declared metered, so the checks those allocations govern keep working and every
-- allocation names a known metric (the service keeps it so from now on). Metrics
-- that were only ever checked, never named by any limit, are not declared: those
-- are what this change refuses.
BEGIN;
ALTER TABLE plans ADD COLUMN metered text[] NOT NULL DEFAULT '{}';
UPDATE plans p SET metered = a.metrics
FROM (
    SELECT o.plan_id, array_agg(DISTINCT l.metric ORDER BY l.metric) AS metrics
    FROM orgs o
    JOIN (SELECT org_id, metric FROM team_limits UNION SELECT org_id, metric FROM user_limits) l ON l.org_id = o.id
    WHERE NOT EXISTS (SELECT 1 FROM plan_limits pl WHERE pl.plan_id = o.plan_id AND pl.metric = l.metric)
      AND NOT EXISTS (SELECT 1 FROM plan_prices pp WHERE pp.plan_id = o.plan_id AND pp.metric = l.metric)
    GROUP BY o.plan_id
) a
WHERE a.plan_id = p.id;
COMMIT;
