-- Token buckets: a limit of a second to day window may carry a burst, the most the
-- bucket holds (it refills max_units per window). NULL is a sliding window; month and
-- concurrent limits never carry one.
BEGIN;
ALTER TABLE plan_limits ADD COLUMN burst bigint
    CONSTRAINT plan_limits_burst_check CHECK (burst IS NULL OR (burst >= 1 AND time_window IN ('second', 'minute', 'hour', 'day')));
ALTER TABLE org_limits ADD COLUMN burst bigint
    CONSTRAINT org_limits_burst_check CHECK (burst IS NULL OR (burst >= 1 AND time_window IN ('second', 'minute', 'hour', 'day')));
ALTER TABLE team_limits ADD COLUMN burst bigint
    CONSTRAINT team_limits_burst_check CHECK (burst IS NULL OR (burst >= 1 AND time_window IN ('second', 'minute', 'hour', 'day')));
ALTER TABLE user_limits ADD COLUMN burst bigint
    CONSTRAINT user_limits_burst_check CHECK (burst IS NULL OR (burst >= 1 AND time_window IN ('second', 'minute', 'hour', 'day')));
COMMIT;
