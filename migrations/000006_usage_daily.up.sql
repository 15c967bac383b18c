-- Daily history of usage: per org, period, metric and UTC day, the org's cumulative
-- usage of the period at the end of that day, written by the worker's flusher in the
-- same transaction as the ledger (usage_counters) and raised only with GREATEST, so
-- it is monotonic and a repeated or late flush is harmless. A day without a row saw
-- no change. It feeds the `daily` series of the usage API. (000004 is unused.)
BEGIN;
CREATE TABLE usage_daily (
    org_id     text   NOT NULL,
    period     text   NOT NULL CHECK (period ~ '^[0-9]{4}-(0[1-9]|1[0-2])$'),
    metric     text   NOT NULL,
    day        date   NOT NULL,
    used       bigint NOT NULL CHECK (used >= 0),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, period, metric, day)
);
COMMIT;
