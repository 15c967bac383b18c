-- Console emails are unique per org, not across all orgs (issue 27): a unique index
-- across orgs let any org admin learn, from a 409, which emails hold a console account
-- in another org. Sign-in names the org (console/api/sign-in takes "org").
BEGIN;
DROP INDEX IF EXISTS console_users_email_idx;
CREATE UNIQUE INDEX console_users_org_email_idx ON console_users (org_id, lower(email));
COMMIT;
