-- Leases (issue 17): a plan's hot paths may be admitted in process from leases
-- ('auto', the default) or never ('off'); an org follows its plan ('plan', the
-- default) or overrides it.
BEGIN;
ALTER TABLE plans ADD COLUMN leases text NOT NULL DEFAULT 'auto' CHECK (leases IN ('auto', 'off'));
ALTER TABLE orgs ADD COLUMN leases text NOT NULL DEFAULT 'plan' CHECK (leases IN ('plan', 'auto', 'off'));
COMMIT;
