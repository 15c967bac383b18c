package tenants

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
)

const consoleCols = `id, org_id, email, role, created_at`

func scanConsoleUser(row pgx.Row) (ConsoleUser, error) {
	var u ConsoleUser
	err := row.Scan(&u.ID, &u.OrgID, &u.Email, &u.Role, &u.CreatedAt)
	return u, err
}

// CreateConsoleUser creates a console account in an org. Emails are unique within
// an org (ErrExists), not across orgs: another org's accounts are no business of the
// caller, and a conflict across orgs would tell which emails exist there.
func (s *Service) CreateConsoleUser(ctx context.Context, a Actor, orgID string, in ConsoleUserInput) (ConsoleUser, error) {
	if err := in.Validate(); err != nil {
		return ConsoleUser{}, err
	}
	hash, err := s.hasher.hash(in.Password)
	if err != nil {
		return ConsoleUser{}, fmt.Errorf("hash password: %w", err)
	}
	idb := make([]byte, 8)
	_, _ = rand.Read(idb)
	id := hex.EncodeToString(idb)
	var out ConsoleUser
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := getOrg(ctx, tx, orgID, s.now()); err != nil {
			return err
		}
		out, err = scanConsoleUser(tx.QueryRow(ctx, `INSERT INTO console_users (id, org_id, email, password_hash, role)
			VALUES ($1, $2, $3, $4, $5) RETURNING `+consoleCols, id, orgID, in.Email, hash, in.Role))
		if err != nil {
			return translate(err, fmt.Sprintf("create console user %q", in.Email))
		}
		return audit(ctx, tx, a, orgID, "console_user.create", "console_user:"+id, nil, out)
	})
	return out, err
}

// GetConsoleUser returns a console user of an org.
func (s *Service) GetConsoleUser(ctx context.Context, orgID, id string) (ConsoleUser, error) {
	u, err := scanConsoleUser(s.pool.QueryRow(ctx, `SELECT `+consoleCols+` FROM console_users WHERE org_id = $1 AND id = $2`, orgID, id))
	return u, translate(err, fmt.Sprintf("console user %q", id))
}

// ListConsoleUsers returns one page of an org's console users ordered by id.
func (s *Service) ListConsoleUsers(ctx context.Context, orgID string, page Page) ([]ConsoleUser, string, error) {
	if _, err := getOrg(ctx, s.pool, orgID, s.now()); err != nil {
		return nil, "", err
	}
	return listPage(ctx, s.pool, "console users", page, `SELECT `+consoleCols+` FROM console_users WHERE org_id = $1 AND id > $2 ORDER BY id LIMIT $3`,
		scanConsoleUser, func(u ConsoleUser) string { return u.ID }, orgID)
}

// DeleteConsoleUser deletes a console user of an org.
func (s *Service) DeleteConsoleUser(ctx context.Context, a Actor, orgID, id string) error {
	return s.inTx(ctx, func(tx pgx.Tx) error {
		before, err := scanConsoleUser(tx.QueryRow(ctx, `DELETE FROM console_users WHERE org_id = $1 AND id = $2 RETURNING `+consoleCols, orgID, id))
		if err != nil {
			return translate(err, fmt.Sprintf("console user %q", id))
		}
		return audit(ctx, tx, a, orgID, "console_user.delete", "console_user:"+id, before, nil)
	})
}

// RecordAudit writes one audit row of an action that changes no stored object, such
// as a test webhook sent (webhook.test); after describes what was done and must carry
// no secret.
func (s *Service) RecordAudit(ctx context.Context, a Actor, orgID, action, object string, after any) error {
	return s.inTx(ctx, func(tx pgx.Tx) error {
		return audit(ctx, tx, a, orgID, action, object, nil, after)
	})
}

// VerifyConsoleLogin returns the console user of org with email when password
// matches. Unknown orgs, unknown emails and wrong passwords are the same ErrNotFound,
// and each costs one password hash, so neither the answer nor its time tells whether
// the email exists (in this org or another). (Lockout after repeated failures belongs
// to the console's sign-in.)
func (s *Service) VerifyConsoleLogin(ctx context.Context, org, email, password string) (ConsoleUser, error) {
	var u ConsoleUser
	var hash string
	err := s.pool.QueryRow(ctx, `SELECT `+consoleCols+`, password_hash FROM console_users WHERE org_id = $1 AND lower(email) = lower($2)`, org, email).
		Scan(&u.ID, &u.OrgID, &u.Email, &u.Role, &u.CreatedAt, &hash)
	if err != nil {
		// Hash anyway so an unknown email takes as long as a wrong password (and is
		// as busy when every hash slot is taken).
		if _, herr := s.hasher.hash(password); errors.Is(herr, ErrPasswordBusy) {
			return ConsoleUser{}, fmt.Errorf("console login: %w", herr)
		}
		return ConsoleUser{}, translate(err, "console login")
	}
	ok, err := s.hasher.verify(hash, password)
	if err != nil {
		return ConsoleUser{}, fmt.Errorf("console login: %w", err)
	}
	if !ok {
		return ConsoleUser{}, fmt.Errorf("console login: %w", ErrNotFound)
	}
	return u, nil
}

// ListAudit returns one page of an org's audit log, newest first.
func (s *Service) ListAudit(ctx context.Context, orgID string, page Page) ([]AuditEntry, string, error) {
	if _, err := getOrg(ctx, s.pool, orgID, s.now()); err != nil {
		return nil, "", err
	}
	c, err := decodeCursor(page.Cursor)
	if err != nil {
		return nil, "", err
	}
	before := int64(1<<63 - 1)
	if c != "" {
		if before, err = strconv.ParseInt(c, 10, 64); err != nil {
			return nil, "", badCursor()
		}
	}
	n := pageLimit(page)
	rows, err := s.pool.Query(ctx, `SELECT id, coalesce(org_id, ''), actor, action, object, before, after, request_id, at
		FROM audit_log WHERE org_id = $1 AND id < $2 ORDER BY id DESC LIMIT $3`, orgID, before, n+1)
	if err != nil {
		return nil, "", fmt.Errorf("list audit: %w", err)
	}
	es, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (AuditEntry, error) {
		var e AuditEntry
		err := r.Scan(&e.ID, &e.OrgID, &e.Actor, &e.Action, &e.Object, &e.Before, &e.After, &e.RequestID, &e.Time)
		return e, err
	})
	if err != nil {
		return nil, "", fmt.Errorf("list audit: %w", err)
	}
	es, next := nextCursor(es, n, func(e AuditEntry) string { return strconv.FormatInt(e.ID, 10) })
	return es, next, nil
}

// SetConsolePassword replaces the password of a console user of an org, found by
// email, and ends every session of that user in the same transaction: whoever held
// the old password (or a session started with it) is signed out at once. The console
// starts a new session for a user who changed their own (console.Sessions).
func (s *Service) SetConsolePassword(ctx context.Context, a Actor, orgID, email, password string) error {
	if err := (ConsoleUserInput{Email: email, Password: password, Role: RoleViewer}).Validate(); err != nil {
		return err
	}
	hash, err := s.hasher.hash(password)
	if err != nil {
		return fmt.Errorf("hash password: %w", err)
	}
	return s.inTx(ctx, func(tx pgx.Tx) error {
		u, err := scanConsoleUser(tx.QueryRow(ctx, `UPDATE console_users SET password_hash = $3
			WHERE org_id = $1 AND lower(email) = lower($2) RETURNING `+consoleCols, orgID, email, hash))
		if err != nil {
			return translate(err, fmt.Sprintf("console user %q", email))
		}
		if _, err := tx.Exec(ctx, `DELETE FROM console_sessions WHERE user_id = $1`, u.ID); err != nil {
			return fmt.Errorf("end sessions of console user %q: %w", u.ID, err)
		}
		// The snapshot carries no hash; the row records that the password changed.
		return audit(ctx, tx, a, orgID, "console_user.set_password", "console_user:"+u.ID, u, u)
	})
}
