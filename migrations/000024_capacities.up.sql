-- Fair share under saturation (docs/ARCHITECTURE.md "Capacities and fair share").
-- A capacity is the operator's limit above every org, for one metric and sliding
-- window; plans, orgs and teams carry the weights shares are made by; an org limit of
-- a second to day window may be shared by its teams (fair_share).
BEGIN;
CREATE TABLE capacities (
    id          text PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$'),
    metric      text   NOT NULL CHECK (metric ~ '^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$'),
    time_window text   NOT NULL CHECK (time_window IN ('second', 'minute', 'hour', 'day')),
    max_units   bigint NOT NULL CHECK (max_units BETWEEN 1 AND 1125899906842624),
    saturation  double precision NOT NULL DEFAULT 0.8 CHECK (saturation > 0 AND saturation <= 1),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE plans ADD COLUMN weight integer NOT NULL DEFAULT 1
    CONSTRAINT plans_weight_check CHECK (weight BETWEEN 1 AND 1000);
-- NULL: the plan's weight.
ALTER TABLE orgs ADD COLUMN weight integer
    CONSTRAINT orgs_weight_check CHECK (weight IS NULL OR weight BETWEEN 1 AND 1000);
ALTER TABLE teams ADD COLUMN weight integer NOT NULL DEFAULT 1
    CONSTRAINT teams_weight_check CHECK (weight BETWEEN 1 AND 1000);
ALTER TABLE plan_limits ADD COLUMN fair_share boolean NOT NULL DEFAULT false
    CONSTRAINT plan_limits_fair_share_check CHECK (NOT fair_share OR time_window IN ('second', 'minute', 'hour', 'day'));
ALTER TABLE org_limits ADD COLUMN fair_share boolean NOT NULL DEFAULT false
    CONSTRAINT org_limits_fair_share_check CHECK (NOT fair_share OR time_window IN ('second', 'minute', 'hour', 'day'));
COMMIT;
