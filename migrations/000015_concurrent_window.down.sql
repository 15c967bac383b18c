-- Concurrent limits go with the window.
BEGIN;
DELETE FROM plan_limits WHERE time_window = 'concurrent';
DELETE FROM org_limits WHERE time_window = 'concurrent';
DELETE FROM team_limits WHERE time_window = 'concurrent';
DELETE FROM user_limits WHERE time_window = 'concurrent';
ALTER TABLE plan_limits DROP CONSTRAINT plan_limits_time_window_check,
    ADD CONSTRAINT plan_limits_time_window_check CHECK (time_window IN ('second', 'minute', 'hour', 'day', 'month'));
ALTER TABLE org_limits DROP CONSTRAINT org_limits_time_window_check,
    ADD CONSTRAINT org_limits_time_window_check CHECK (time_window IN ('second', 'minute', 'hour', 'day', 'month'));
ALTER TABLE team_limits DROP CONSTRAINT team_limits_time_window_check,
    ADD CONSTRAINT team_limits_time_window_check CHECK (time_window IN ('second', 'minute', 'hour', 'day', 'month'));
ALTER TABLE user_limits DROP CONSTRAINT user_limits_time_window_check,
    ADD CONSTRAINT user_limits_time_window_check CHECK (time_window IN ('second', 'minute', 'hour', 'day', 'month'));
COMMIT;
