-- Client leases (issue 43): a plan's orgs' clients may take client leases
-- (POST /v1/leases, 'auto', the default) or never ('off': every lease is answered
-- with no units); an org follows its plan ('plan', the default) or overrides it.
BEGIN;
ALTER TABLE plans ADD COLUMN client_leases text NOT NULL DEFAULT 'auto' CHECK (client_leases IN ('auto', 'off'));
ALTER TABLE orgs ADD COLUMN client_leases text NOT NULL DEFAULT 'plan' CHECK (client_leases IN ('plan', 'auto', 'off'));
COMMIT;
