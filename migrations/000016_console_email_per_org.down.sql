-- Back to one console account per email across all orgs; fails when two orgs hold
-- the same email (remove one first).
BEGIN;
DROP INDEX IF EXISTS console_users_org_email_idx;
CREATE UNIQUE INDEX console_users_email_idx ON console_users (lower(email));
COMMIT;
