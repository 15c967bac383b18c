-- Adaptive throttles: a factor 0 < f <= 1 that multiplies every sliding-window limit
-- (and the month limit when month is true) of an org, or of every org of a plan,
-- until expires_at. One row per org or plan; a new throttle replaces the old. An
-- expired row no longer applies (the check path compares expires_at with its own
-- clock) and is replaced by the next PUT or removed by DELETE.
BEGIN;
CREATE TABLE throttles (
    org_id     text REFERENCES orgs (id) ON DELETE CASCADE,
    plan_id    text REFERENCES plans (id) ON DELETE CASCADE,
    factor_ppm bigint NOT NULL CHECK (factor_ppm > 0 AND factor_ppm <= 1000000),
    month      boolean NOT NULL DEFAULT false,
    reason     text NOT NULL,
    expires_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    created_by text NOT NULL,
    CHECK ((org_id IS NULL) <> (plan_id IS NULL))
);
CREATE UNIQUE INDEX throttles_org ON throttles (org_id) WHERE org_id IS NOT NULL;
CREATE UNIQUE INDEX throttles_plan ON throttles (plan_id) WHERE plan_id IS NOT NULL;
COMMIT;
