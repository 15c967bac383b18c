-- Grants (top-ups): units the operator adds to an org's month limit of a metric,
-- from created_at until `until` (by default the end of the billing period it was
-- made in), unless revoked before. While active a grant raises the org's month limit
-- by its units: checks, allocation rules and usage see the larger limit, and the
-- billing export reports the units granted in each period. A revoked grant stays
-- listed with revoked_at set. Ids and metrics are validated by the service.
BEGIN;
CREATE TABLE grants (
    id         text   PRIMARY KEY,
    org_id     text   NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
    metric     text   NOT NULL,
    units      bigint NOT NULL CHECK (units > 0),
    reason     text   NOT NULL CHECK (length(reason) BETWEEN 1 AND 500),
    until      timestamptz NOT NULL,
    created_at timestamptz NOT NULL,
    revoked_at timestamptz,
    CHECK (until > created_at)
);
-- The active grants of an org, and its grants newest first.
CREATE INDEX grants_org_idx ON grants (org_id, created_at DESC, id);
COMMIT;
