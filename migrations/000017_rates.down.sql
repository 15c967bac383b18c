BEGIN;
DROP TABLE org_rates;
DROP TABLE plan_rates;
ALTER TABLE plans DROP COLUMN rate_currency;
COMMIT;
