-- Precise sliding windows (issue 22): a plan's sliding windows are counted by the
-- two-bucket estimate ('estimate', the default: a real span of one window may admit up
-- to twice a limit) or in sub-buckets ('precise': never more than the limit, at
-- 1.5-1.8x the Redis time per check); an org follows its plan ('plan', the default) or
-- overrides it.
BEGIN;
ALTER TABLE plans ADD COLUMN sliding_windows text NOT NULL DEFAULT 'estimate' CHECK (sliding_windows IN ('estimate', 'precise'));
ALTER TABLE orgs ADD COLUMN sliding_windows text NOT NULL DEFAULT 'plan' CHECK (sliding_windows IN ('plan', 'estimate', 'precise'));
COMMIT;
