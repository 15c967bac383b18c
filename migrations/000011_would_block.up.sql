-- Would-block records: per org, period, Redis epoch of the record, limit (metric,
-- level, team, user, window) and UTC day, how many checks of an org in shadow or warn
-- mode enforce would have denied, and their units. The worker copies the api's
-- records from Redis (quota's <p>:{<org>}|b|<period> hash) and raises values only with
-- GREATEST, so repeated and concurrent flushes are harmless. A record that Redis lost
-- is created again with a new epoch, and its counts start from zero beside the stored
-- ones: the report adds the epochs. Level 'other' counts what went beyond the cap of
-- distinct rows (its metric, team, user and window are empty). No foreign key to orgs,
-- like the ledger.
BEGIN;
CREATE TABLE would_block (
    org_id     text   NOT NULL,
    period     text   NOT NULL CHECK (period ~ '^[0-9]{4}-(0[1-9]|1[0-2])$'),
    epoch      text   NOT NULL,
    metric     text   NOT NULL,
    level      text   NOT NULL CHECK (level IN ('org', 'team', 'user', 'other')),
    team_id    text   NOT NULL DEFAULT '',
    user_id    text   NOT NULL DEFAULT '',
    win        text   NOT NULL,
    day        date   NOT NULL,
    checks     bigint NOT NULL CHECK (checks >= 0),
    units      bigint NOT NULL CHECK (units >= 0),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, period, epoch, metric, level, team_id, user_id, win, day)
);
COMMIT;
