-- Web console sessions. Only the SHA-256 of the session id is stored, so a leaked
-- table cannot be replayed as cookies. A session ends at its absolute expiry, after
-- an idle gap (checked against last_seen_at), at sign-out, or with its console user.
BEGIN;
CREATE TABLE console_sessions (
    id_hash      bytea PRIMARY KEY CHECK (length(id_hash) = 32),
    user_id      text NOT NULL REFERENCES console_users (id) ON DELETE CASCADE,
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL
);
CREATE INDEX console_sessions_user_idx ON console_sessions (user_id);
CREATE INDEX console_sessions_expires_idx ON console_sessions (expires_at);
COMMIT;
