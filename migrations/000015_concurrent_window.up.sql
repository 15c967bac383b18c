-- Concurrency limits (issue 24): a limit's window may be 'concurrent', the units held
-- at once by open reservations, in plans, org overrides, team and user allocations.
BEGIN;
ALTER TABLE plan_limits DROP CONSTRAINT plan_limits_time_window_check,
    ADD CONSTRAINT plan_limits_time_window_check CHECK (time_window IN ('second', 'minute', 'hour', 'day', 'month', 'concurrent'));
ALTER TABLE org_limits DROP CONSTRAINT org_limits_time_window_check,
    ADD CONSTRAINT org_limits_time_window_check CHECK (time_window IN ('second', 'minute', 'hour', 'day', 'month', 'concurrent'));
ALTER TABLE team_limits DROP CONSTRAINT team_limits_time_window_check,
    ADD CONSTRAINT team_limits_time_window_check CHECK (time_window IN ('second', 'minute', 'hour', 'day', 'month', 'concurrent'));
ALTER TABLE user_limits DROP CONSTRAINT user_limits_time_window_check,
    ADD CONSTRAINT user_limits_time_window_check CHECK (time_window IN ('second', 'minute', 'hour', 'day', 'month', 'concurrent'));
COMMIT;
