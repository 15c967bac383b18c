BEGIN;
ALTER TABLE orgs DROP COLUMN client_leases;
ALTER TABLE plans DROP COLUMN client_leases;
COMMIT;
