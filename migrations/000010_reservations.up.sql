-- Reservations as the worker last persisted them (quota's drain: in the same script
-- run as the month counters, so usage_counters, which holds committed units, and the
-- reservations held are one snapshot). Hydration after Redis restarts empty restores
-- the held ones, units and all. record is the Redis record's fields (quota/KEYS.md).
-- A row only ever moves out of 'held' (a late, older write cannot bring it back).
BEGIN;
CREATE TABLE reservations (
    org_id     text        NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
    id         text        NOT NULL,
    period     text        NOT NULL,
    state      text        NOT NULL CHECK (state IN ('held', 'committed', 'released', 'expired')),
    expires_at timestamptz NOT NULL,
    record     jsonb       NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, id)
);
-- The held reservations of an org's period, for hydration.
CREATE INDEX reservations_held_idx ON reservations (org_id, period) WHERE state = 'held';
COMMIT;
