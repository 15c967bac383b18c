BEGIN;
DROP TABLE IF EXISTS org_webhook_secrets;
COMMIT;
