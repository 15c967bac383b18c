-- Unknown users: an org may refuse checks naming a user id it has not registered
-- ('refuse') or admit them with their team's user defaults ('allow', the default);
-- a team follows its org ('org', the default) or overrides it.
BEGIN;
ALTER TABLE orgs ADD COLUMN unknown_users text NOT NULL DEFAULT 'allow' CHECK (unknown_users IN ('allow', 'refuse'));
ALTER TABLE teams ADD COLUMN unknown_users text NOT NULL DEFAULT 'org' CHECK (unknown_users IN ('org', 'allow', 'refuse'));
COMMIT;
