BEGIN;
-- Issue 28: the per-account lock (5 failures, doubling to 1 h) let anyone who knew an
-- email keep that account locked. Sign-in now slows each (client address, email)
-- and each address across accounts, in the api's memory (internal/console/guard.go);
-- the account itself holds no lock any more.
ALTER TABLE console_users DROP COLUMN failed_logins, DROP COLUMN locked_until;
COMMIT;
