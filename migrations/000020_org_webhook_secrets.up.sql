-- Issue 28: an org's own random webhook signing secret, rotated alone
-- (POST /v1/orgs/{org}/webhook/secret/rotate). An org without a row signs with the
-- derived HMAC(QUOTA_WEBHOOK_SECRET, org) as before; the previous secret (the derived
-- one at the first rotation) still signs, beside the new one, until previous_until.
BEGIN;
CREATE TABLE org_webhook_secrets (
    org_id         text PRIMARY KEY REFERENCES orgs (id) ON DELETE CASCADE,
    secret         text NOT NULL,
    previous       text,
    previous_until timestamptz,
    rotated_at     timestamptz NOT NULL DEFAULT now()
);
COMMIT;
