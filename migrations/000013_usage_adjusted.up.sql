-- Counter adjustments (issue 22): an operator may lower a month counter that is wrong
-- (POST /v1/orgs/{org}/usage/adjustments). adjusted_at is when it was last adjusted, on
-- the engines' clock: a drained value read before it never raises the row back (the
-- ledger otherwise only rises).
BEGIN;
ALTER TABLE usage_counters ADD COLUMN adjusted_at timestamptz;
COMMIT;
