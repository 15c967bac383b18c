-- Money (issue 25): a plan's rate card, its currency and its rates (price of `per`
-- units of a metric, a decimal in currency units with at most 6 places: whole
-- micro-units), and each org's operator overrides of rates. Kept apart from the
-- plan's billing `pricing` (currency, base_price, plan_prices): rates price checks.
BEGIN;
ALTER TABLE plans ADD COLUMN rate_currency text CHECK (rate_currency ~ '^[A-Z]{3}$');
CREATE TABLE plan_rates (
    plan_id text           NOT NULL REFERENCES plans (id) ON DELETE CASCADE,
    metric  text           NOT NULL CHECK (metric <> 'spend'),
    price   numeric(24, 6) NOT NULL CHECK (price >= 0),
    per     bigint         NOT NULL CHECK (per > 0),
    PRIMARY KEY (plan_id, metric)
);
CREATE TABLE org_rates (
    org_id  text           NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
    metric  text           NOT NULL CHECK (metric <> 'spend'),
    price   numeric(24, 6) NOT NULL CHECK (price >= 0),
    per     bigint         NOT NULL CHECK (per > 0),
    PRIMARY KEY (org_id, metric)
);
COMMIT;
