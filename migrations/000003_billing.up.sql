-- Durable usage and billing: the usage ledger the worker flushes live Redis counters
-- into, closed periods with their immutable usage and billing lines, late usage found
-- after a close, events and webhook deliveries. No foreign keys to orgs: the record
-- outlives the tenancy objects it describes (like audit_log).
BEGIN;

-- Last persisted value of every month counter (org, team or user level) of a period.
-- Written only with GREATEST, so a value never goes down (monotonic upsert).
CREATE TABLE usage_counters (
    org_id     text   NOT NULL,
    period     text   NOT NULL CHECK (period ~ '^[0-9]{4}-(0[1-9]|1[0-2])$'),
    metric     text   NOT NULL,
    level      text   NOT NULL CHECK (level IN ('org', 'team', 'user')),
    team_id    text   NOT NULL DEFAULT '',
    user_id    text   NOT NULL DEFAULT '',
    units      bigint NOT NULL CHECK (units >= 0),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, period, metric, level, team_id, user_id),
    CHECK ((level = 'org' AND team_id = '' AND user_id = '')
        OR (level = 'team' AND team_id <> '' AND user_id = '')
        OR (level = 'user' AND team_id <> '' AND user_id <> ''))
);

-- One row per closed period of an org: written once by the period close job.
CREATE TABLE billing_periods (
    org_id       text NOT NULL,
    period       text NOT NULL,
    period_start timestamptz NOT NULL,
    period_end   timestamptz NOT NULL,
    plan_id      text NOT NULL,
    currency     text NOT NULL DEFAULT '',
    closed_at    timestamptz NOT NULL DEFAULT now(),
    closed_by    text NOT NULL,
    PRIMARY KEY (org_id, period)
);
CREATE INDEX billing_periods_period_idx ON billing_periods (period, org_id);

-- Final usage per entity and metric of a closed period, with the month limit in
-- force at close (NULL: none). Immutable.
CREATE TABLE period_usage (
    org_id      text   NOT NULL,
    period      text   NOT NULL,
    metric      text   NOT NULL,
    level       text   NOT NULL CHECK (level IN ('org', 'team', 'user')),
    team_id     text   NOT NULL DEFAULT '',
    user_id     text   NOT NULL DEFAULT '',
    units       bigint NOT NULL CHECK (units >= 0),
    month_limit bigint,
    PRIMARY KEY (org_id, period, metric, level, team_id, user_id),
    FOREIGN KEY (org_id, period) REFERENCES billing_periods (org_id, period)
);

-- One billing line per org, period and metric: the plan's pricing at close applied to
-- the org's final units (priced: the plan prices the metric). Immutable.
CREATE TABLE billing_lines (
    org_id         text   NOT NULL,
    period         text   NOT NULL,
    metric         text   NOT NULL,
    units          bigint NOT NULL CHECK (units >= 0),
    included_units bigint NOT NULL CHECK (included_units >= 0),
    overage_units  bigint NOT NULL CHECK (overage_units >= 0),
    priced         boolean NOT NULL,
    overage_price  numeric(18, 6) NOT NULL DEFAULT 0,
    amount         numeric(24, 6) NOT NULL CHECK (amount >= 0),
    currency       text   NOT NULL DEFAULT '',
    PRIMARY KEY (org_id, period, metric),
    FOREIGN KEY (org_id, period) REFERENCES billing_periods (org_id, period)
);

-- Usage counted in Redis for a period after it was closed (a late flush): the units
-- above what the close recorded, appended, never folded into the immutable rows.
CREATE TABLE usage_adjustments (
    id          bigserial PRIMARY KEY,
    org_id      text   NOT NULL,
    period      text   NOT NULL,
    metric      text   NOT NULL,
    level       text   NOT NULL CHECK (level IN ('org', 'team', 'user')),
    team_id     text   NOT NULL DEFAULT '',
    user_id     text   NOT NULL DEFAULT '',
    units       bigint NOT NULL CHECK (units > 0),
    recorded_at timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (org_id, period) REFERENCES billing_periods (org_id, period)
);
CREATE INDEX usage_adjustments_idx ON usage_adjustments (org_id, period, metric, level, team_id, user_id);

-- Immutable means immutable: closed rows cannot be changed or removed.
CREATE FUNCTION billing_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is immutable', TG_TABLE_NAME USING ERRCODE = 'insufficient_privilege';
END $$;
CREATE TRIGGER billing_periods_immutable BEFORE UPDATE OR DELETE ON billing_periods
    FOR EACH ROW EXECUTE FUNCTION billing_immutable();
CREATE TRIGGER period_usage_immutable BEFORE UPDATE OR DELETE ON period_usage
    FOR EACH ROW EXECUTE FUNCTION billing_immutable();
CREATE TRIGGER billing_lines_immutable BEFORE UPDATE OR DELETE ON billing_lines
    FOR EACH ROW EXECUTE FUNCTION billing_immutable();
CREATE TRIGGER usage_adjustments_immutable BEFORE UPDATE OR DELETE ON usage_adjustments
    FOR EACH ROW EXECUTE FUNCTION billing_immutable();

-- Events of an org (usage.threshold, period.closed); dedup_key makes each one happen
-- once (e.g. threshold 80 of user eng/alice requests in 2026-11).
CREATE TABLE billing_events (
    id         bigserial PRIMARY KEY,
    org_id     text  NOT NULL,
    type       text  NOT NULL CHECK (type IN ('usage.threshold', 'period.closed')),
    period     text  NOT NULL,
    dedup_key  text  NOT NULL,
    payload    jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (org_id, dedup_key)
);
CREATE INDEX billing_events_org_idx ON billing_events (org_id, id DESC);

-- Every webhook delivery attempt, for the org to see.
CREATE TABLE webhook_deliveries (
    id           bigserial PRIMARY KEY,
    event_id     bigint NOT NULL REFERENCES billing_events (id),
    org_id       text   NOT NULL,
    url          text   NOT NULL,
    attempt      integer NOT NULL,
    status_code  integer NOT NULL DEFAULT 0,
    error        text   NOT NULL DEFAULT '',
    succeeded    boolean NOT NULL,
    duration_ms  integer NOT NULL DEFAULT 0,
    attempted_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX webhook_deliveries_org_idx ON webhook_deliveries (org_id, id DESC);
CREATE INDEX webhook_deliveries_event_idx ON webhook_deliveries (event_id);

COMMIT;
