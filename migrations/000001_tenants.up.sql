-- Tenants: plans, orgs, teams, users and their limits; API keys, console users, audit.
-- Limits live in one table per owner kind so that constraints (window names, limit >= 0,
-- one row per metric and window) are enforced by Postgres, and allocation sums are
-- plain indexed aggregates.
BEGIN;

CREATE TABLE plans (
    id          text PRIMARY KEY,
    name        text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    fail_mode   text NOT NULL CHECK (fail_mode IN ('open', 'closed', 'local')),
    pool        text NOT NULL DEFAULT 'default',
    -- pricing: NULL when the plan has none.
    currency    text CHECK (currency ~ '^[A-Z]{3}$'),
    base_price  numeric(18, 6) CHECK (base_price >= 0),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CHECK ((currency IS NULL) = (base_price IS NULL))
);

CREATE TABLE plan_limits (
    plan_id     text   NOT NULL REFERENCES plans (id) ON DELETE CASCADE,
    metric      text   NOT NULL,
    time_window text   NOT NULL CHECK (time_window IN ('second', 'minute', 'hour', 'day', 'month')),
    max_units   bigint NOT NULL CHECK (max_units >= 0),
    PRIMARY KEY (plan_id, metric, time_window)
);

CREATE TABLE plan_prices (
    plan_id        text           NOT NULL REFERENCES plans (id) ON DELETE CASCADE,
    metric         text           NOT NULL,
    included_units bigint         NOT NULL CHECK (included_units >= 0),
    overage_price  numeric(18, 6) NOT NULL CHECK (overage_price >= 0),
    PRIMARY KEY (plan_id, metric)
);

CREATE TABLE orgs (
    id                 text PRIMARY KEY,
    name               text     NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    plan_id            text     NOT NULL REFERENCES plans (id) ON DELETE RESTRICT,
    mode               text     NOT NULL DEFAULT 'enforce' CHECK (mode IN ('enforce', 'shadow', 'warn')),
    oversubscribe      boolean  NOT NULL DEFAULT false,
    webhook_url        text     NOT NULL DEFAULT '',
    redis_url          text     NOT NULL DEFAULT '',
    billing_anchor_day smallint NOT NULL DEFAULT 1 CHECK (billing_anchor_day BETWEEN 1 AND 28),
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX orgs_plan_id_idx ON orgs (plan_id);

-- Org overrides of its plan's limits.
CREATE TABLE org_limits (
    org_id      text   NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
    metric      text   NOT NULL,
    time_window text   NOT NULL CHECK (time_window IN ('second', 'minute', 'hour', 'day', 'month')),
    max_units   bigint NOT NULL CHECK (max_units >= 0),
    PRIMARY KEY (org_id, metric, time_window)
);

CREATE TABLE teams (
    org_id     text NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
    id         text NOT NULL,
    name       text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, id)
);

-- kind 'team' is the team's own allocation; 'user_default' the limits of its users
-- that have no allocation of their own.
CREATE TABLE team_limits (
    org_id      text   NOT NULL,
    team_id     text   NOT NULL,
    kind        text   NOT NULL CHECK (kind IN ('team', 'user_default')),
    metric      text   NOT NULL,
    time_window text   NOT NULL CHECK (time_window IN ('second', 'minute', 'hour', 'day', 'month')),
    max_units   bigint NOT NULL CHECK (max_units >= 0),
    PRIMARY KEY (org_id, team_id, kind, metric, time_window),
    FOREIGN KEY (org_id, team_id) REFERENCES teams (org_id, id) ON DELETE CASCADE
);
-- Allocation sums per org and metric: sum of the teams' month limits.
CREATE INDEX team_limits_alloc_idx ON team_limits (org_id, metric, time_window) WHERE kind = 'team';

-- A user id is unique within its org: a check may name a registered user without its team.
CREATE TABLE users (
    org_id     text NOT NULL,
    id         text NOT NULL,
    team_id    text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, id),
    FOREIGN KEY (org_id, team_id) REFERENCES teams (org_id, id) ON DELETE CASCADE
);
CREATE INDEX users_team_idx ON users (org_id, team_id, id);

CREATE TABLE user_limits (
    org_id      text   NOT NULL,
    user_id     text   NOT NULL,
    metric      text   NOT NULL,
    time_window text   NOT NULL CHECK (time_window IN ('second', 'minute', 'hour', 'day', 'month')),
    max_units   bigint NOT NULL CHECK (max_units >= 0),
    PRIMARY KEY (org_id, user_id, metric, time_window),
    FOREIGN KEY (org_id, user_id) REFERENCES users (org_id, id) ON DELETE CASCADE
);

-- Org API keys. The secret is never stored: only the SHA-256 digest of the whole token.
CREATE TABLE api_keys (
    id           text  PRIMARY KEY,
    org_id       text  NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
    name         text  NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    prefix       text  NOT NULL,
    digest       bytea NOT NULL CHECK (length(digest) = 32),
    scopes       text[] NOT NULL CHECK (cardinality(scopes) > 0 AND scopes <@ ARRAY['check', 'admin', 'billing']),
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz,
    revoked_at   timestamptz
);
CREATE INDEX api_keys_org_idx ON api_keys (org_id, id);

CREATE TABLE console_users (
    id              text PRIMARY KEY,
    org_id          text NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
    email           text NOT NULL CHECK (length(email) BETWEEN 3 AND 254),
    password_hash   text NOT NULL,
    role            text NOT NULL CHECK (role IN ('admin', 'viewer')),
    failed_logins   integer NOT NULL DEFAULT 0,
    locked_until    timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now()
);
-- One console account per email across all orgs: sign-in needs no org name.
CREATE UNIQUE INDEX console_users_email_idx ON console_users (lower(email));
CREATE INDEX console_users_org_idx ON console_users (org_id, id);

-- Append-only record of every change. No foreign key: the trail outlives its objects.
CREATE TABLE audit_log (
    id          bigserial PRIMARY KEY,
    org_id      text,
    actor       text  NOT NULL,
    action      text  NOT NULL,
    object      text  NOT NULL,
    before      jsonb,
    after       jsonb,
    request_id  text  NOT NULL DEFAULT '',
    at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX audit_log_org_idx ON audit_log (org_id, id DESC);

COMMIT;
