// Package console is the server side of the web console for org admins: it serves the
// built single-page app at /console/, signs console users in and out, and keeps their
// sessions. The app itself talks to the same /v1 API as every other client; the HTTP
// layer accepts a session cookie there as a principal (see Authenticate).
//
// Sessions: a random 256-bit id travels in an HttpOnly, SameSite=Strict cookie (Secure
// when the request came over TLS) and only its SHA-256 is stored in Postgres, with an
// idle and an absolute expiry. Every change made with the cookie must carry the
// session's CSRF token in the X-CSRF-Token header. Repeated failed sign-ins lock the
// account for a growing time (console_users.failed_logins / locked_until).
package console

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/platform/pgdb"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// Errors of the session service.
var (
	// ErrBadLogin is every failed sign-in: unknown org or email, wrong password or a
	// locked account look the same to the caller.
	ErrBadLogin = derrors.New(derrors.Unauthenticated, "wrong organization, email or password, or too many failed attempts; try again later")
	// ErrNoSession means the session id is unknown, expired or signed out.
	ErrNoSession = derrors.New(derrors.Unauthenticated, "no such session, or it has expired")
)

// Options tune sessions and lockout; zero fields take the defaults.
type Options struct {
	IdleTimeout     time.Duration // a session unused this long ends; default 30m
	MaxAge          time.Duration // a session ends this long after sign-in; default 12h
	MaxFailures     int           // failed sign-ins in a row before the account locks; default 5
	LockFor         time.Duration // first lock; it doubles with every further failure; default 1m
	MaxLock         time.Duration // longest lock; default 1h
	Now             func() time.Time
	touchResolution time.Duration // last_seen_at is written at most this often
}

func (o *Options) defaults() {
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 30 * time.Minute
	}
	if o.MaxAge <= 0 {
		o.MaxAge = 12 * time.Hour
	}
	if o.MaxFailures <= 0 {
		o.MaxFailures = 5
	}
	if o.LockFor <= 0 {
		o.LockFor = time.Minute
	}
	if o.MaxLock <= 0 {
		o.MaxLock = time.Hour
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.touchResolution <= 0 {
		o.touchResolution = time.Minute
	}
}

// Verifier checks a console user's password; *tenants.Service is one. It returns an
// error wrapping tenants.ErrNotFound for an unknown org or email or a wrong password,
// after one password hash whichever it was.
type Verifier interface {
	VerifyConsoleLogin(ctx context.Context, org, email, password string) (tenants.ConsoleUser, error)
}

// Sessions signs console users in and keeps their sessions in Postgres.
type Sessions struct {
	pool   pgdb.DB
	verify Verifier
	opt    Options
}

// NewSessions returns the session service on the database of pool.
func NewSessions(pool *pgxpool.Pool, verify Verifier, opt Options) *Sessions {
	opt.defaults()
	return &Sessions{pool: pgdb.DB{Pool: pool}, verify: verify, opt: opt}
}

// Session is a signed-in console user.
type Session struct {
	UserID    string       `json:"user_id"`
	Email     string       `json:"email"`
	OrgID     string       `json:"org"`
	Role      tenants.Role `json:"role"`
	CSRFToken string       `json:"csrf_token"`
	ExpiresAt time.Time    `json:"expires_at"` // the absolute expiry
}

// CanChange reports whether the session may change anything (admins only).
func (s Session) CanChange() bool { return s.Role == tenants.RoleAdmin }

func hashID(id string) []byte {
	h := sha256.Sum256([]byte(id))
	return h[:]
}

// csrfToken derives the session's CSRF token from its secret id. It is as unguessable
// as the id, needs no storage, and a cross-site page cannot compute it because it
// cannot read the HttpOnly cookie.
func csrfToken(id string) string {
	h := sha256.Sum256([]byte("quotaplane console csrf\x00" + id))
	return base64.RawURLEncoding.EncodeToString(h[:])
}

// ValidCSRF reports whether token is the CSRF token of session id, in constant time.
func ValidCSRF(id, token string) bool {
	want := csrfToken(id)
	return token != "" && subtle.ConstantTimeCompare([]byte(want), []byte(token)) == 1
}

// SignIn checks the account of email in org, and its password, and starts a session.
// It returns the session id (the cookie's value) and the session. Emails are unique
// per org only, so the org is part of the sign-in; exactly one account is looked at
// and one password hash computed whatever exists, so no answer or timing tells whether
// the email exists in this org or another. Every failure is ErrBadLogin; a failure for
// a known account counts towards its lockout, and a locked account is refused even
// with the right password.
func (s *Sessions) SignIn(ctx context.Context, org, email, password string) (string, Session, error) {
	now := s.opt.Now()
	var userID string
	var lockedUntil *time.Time
	err := s.pool.QueryRow(ctx, `SELECT id, locked_until FROM console_users WHERE org_id = $1 AND lower(email) = lower($2)`, org, email).
		Scan(&userID, &lockedUntil)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", Session{}, fmt.Errorf("sign in: %w", err)
	}
	// Verify even when unknown or locked, so all failures take the same time.
	u, verr := s.verify.VerifyConsoleLogin(ctx, org, email, password)
	if verr != nil && !errors.Is(verr, tenants.ErrNotFound) {
		return "", Session{}, fmt.Errorf("sign in: %w", verr)
	}
	if userID == "" {
		return "", Session{}, ErrBadLogin
	}
	if lockedUntil != nil && lockedUntil.After(now) {
		return "", Session{}, ErrBadLogin
	}
	if verr != nil {
		if err := s.recordFailure(ctx, userID, now); err != nil {
			return "", Session{}, err
		}
		return "", Session{}, ErrBadLogin
	}

	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", Session{}, fmt.Errorf("session id: %w", err)
	}
	id := base64.RawURLEncoding.EncodeToString(raw)
	sess := Session{UserID: u.ID, Email: u.Email, OrgID: u.OrgID, Role: u.Role, CSRFToken: csrfToken(id),
		ExpiresAt: now.Add(s.opt.MaxAge).UTC().Truncate(time.Microsecond)}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE console_users SET failed_logins = 0, locked_until = NULL WHERE id = $1`, u.ID); err != nil {
			return err
		}
		// Sweep ended sessions now and then; sign-in is rare enough to carry it.
		if _, err := tx.Exec(ctx, `DELETE FROM console_sessions WHERE expires_at <= $1 OR last_seen_at <= $2`,
			now, now.Add(-s.opt.IdleTimeout)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO console_sessions (id_hash, user_id, created_at, last_seen_at, expires_at)
			VALUES ($1, $2, $3, $3, $4)`, hashID(id), u.ID, now, sess.ExpiresAt)
		return err
	})
	if err != nil {
		return "", Session{}, fmt.Errorf("start session: %w", err)
	}
	return id, sess, nil
}

// recordFailure counts a failed sign-in; from MaxFailures on, each failure locks the
// account for LockFor, doubling with every further failure up to MaxLock.
func (s *Sessions) recordFailure(ctx context.Context, userID string, now time.Time) error {
	var failures int
	if err := s.pool.QueryRow(ctx, `UPDATE console_users SET failed_logins = failed_logins + 1
		WHERE id = $1 RETURNING failed_logins`, userID).Scan(&failures); err != nil {
		return fmt.Errorf("record failed sign-in: %w", err)
	}
	if failures < s.opt.MaxFailures {
		return nil
	}
	lock := s.opt.LockFor
	for i := s.opt.MaxFailures; i < failures && lock < s.opt.MaxLock; i++ {
		lock *= 2
	}
	lock = min(lock, s.opt.MaxLock)
	if _, err := s.pool.Exec(ctx, `UPDATE console_users SET locked_until = $2 WHERE id = $1`, userID, now.Add(lock)); err != nil {
		return fmt.Errorf("lock console user: %w", err)
	}
	return nil
}

// Lookup returns the live session of id, ending it (ErrNoSession) when it is past its
// absolute or idle expiry. The user's current role and org are read each time, so a
// changed or deleted console user takes effect at once.
func (s *Sessions) Lookup(ctx context.Context, id string) (Session, error) {
	if id == "" {
		return Session{}, ErrNoSession
	}
	now := s.opt.Now()
	h := hashID(id)
	var sess Session
	var lastSeen time.Time
	err := s.pool.QueryRow(ctx, `SELECT u.id, u.email, u.org_id, u.role, s.expires_at, s.last_seen_at
		FROM console_sessions s JOIN console_users u ON u.id = s.user_id WHERE s.id_hash = $1`, h).
		Scan(&sess.UserID, &sess.Email, &sess.OrgID, &sess.Role, &sess.ExpiresAt, &lastSeen)
	if errors.Is(err, pgx.ErrNoRows) {
		return Session{}, ErrNoSession
	}
	if err != nil {
		return Session{}, fmt.Errorf("look up session: %w", err)
	}
	if !now.Before(sess.ExpiresAt) || !now.Before(lastSeen.Add(s.opt.IdleTimeout)) {
		_, _ = s.pool.Exec(ctx, `DELETE FROM console_sessions WHERE id_hash = $1`, h)
		return Session{}, ErrNoSession
	}
	if now.Sub(lastSeen) >= s.opt.touchResolution {
		if _, err := s.pool.Exec(ctx, `UPDATE console_sessions SET last_seen_at = $2 WHERE id_hash = $1`, h, now); err != nil {
			return Session{}, fmt.Errorf("touch session: %w", err)
		}
	}
	sess.CSRFToken = csrfToken(id)
	return sess, nil
}

// SignOut ends the session of id; an unknown id is no error.
func (s *Sessions) SignOut(ctx context.Context, id string) error {
	if _, err := s.pool.Exec(ctx, `DELETE FROM console_sessions WHERE id_hash = $1`, hashID(id)); err != nil {
		return fmt.Errorf("sign out: %w", err)
	}
	return nil
}
