package console

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/hashicorp/golang-lru/v2/expirable"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/platform/pgdb"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// Errors of the session service.
var (
	// ErrBadLogin is every failed sign-in: unknown org or email and wrong password
	// look the same to the caller.
	ErrBadLogin = derrors.New(derrors.Unauthenticated, "wrong organization, email or password")
	// ErrNoSession means the session id is unknown, expired or signed out.
	ErrNoSession = derrors.New(derrors.Unauthenticated, "no such session, or it has expired")
)

// Options tune sessions and sign-in; zero fields take the defaults.
type Options struct {
	IdleTimeout time.Duration // a session unused this long ends; default 30m
	MaxAge      time.Duration // a session ends this long after sign-in; default 12h
	// SignIn bounds sign-ins before their password is hashed: per address, per
	// address and email (a growing delay), across accounts and in all (see Limits).
	SignIn Limits
	// UnknownSessions bounds the cache of cookies that named no live session (default
	// 10000 entries, each remembered for a minute): a client repeating a stale or
	// made-up cookie costs one Postgres query a minute, not one a request.
	UnknownSessions int
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
	if o.UnknownSessions <= 0 {
		o.UnknownSessions = 10_000
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.touchResolution <= 0 {
		o.touchResolution = time.Minute
	}
}

// unknownTTL is how long a cookie that named no session is answered from memory.
const unknownTTL = time.Minute

// Verifier checks and sets console users' passwords; *tenants.Service is one.
// VerifyConsoleLogin returns an error wrapping tenants.ErrNotFound for an unknown org
// or email or a wrong password, after one password hash whichever it was, and
// tenants.ErrPasswordBusy when no hash slot is free. SetConsolePassword ends every
// session of the user.
type Verifier interface {
	VerifyConsoleLogin(ctx context.Context, org, email, password string) (tenants.ConsoleUser, error)
	SetConsolePassword(ctx context.Context, a tenants.Actor, orgID, email, password string) error
}

// Sessions signs console users in and keeps their sessions in Postgres.
type Sessions struct {
	pool    pgdb.DB
	verify  Verifier
	opt     Options
	guard   *guard
	unknown *expirable.LRU[string, struct{}] // hashes of ids that named no session
}

// NewSessions returns the session service on the database of pool.
func NewSessions(pool *pgxpool.Pool, verify Verifier, opt Options) *Sessions {
	opt.defaults()
	return &Sessions{pool: pgdb.DB{Pool: pool}, verify: verify, opt: opt, guard: newGuard(opt.SignIn),
		unknown: expirable.NewLRU[string, struct{}](opt.UnknownSessions, nil, unknownTTL)}
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
// ip is the client's address (forwarded.Proxies.ClientIP). It returns the session id
// (the cookie's value) and the session. Emails are unique per org only, so the org is
// part of the sign-in; exactly one account is looked at and one password hash
// computed whatever exists, so no answer or timing tells whether the email exists in
// this org or another.
//
// Before any hash, the sign-in must pass the limits of Options.SignIn (a
// *ThrottledError, 429, when it does not) and find a free hash slot
// (tenants.ErrPasswordBusy, 503). Every failure of the password itself is
// ErrBadLogin and counts towards the delay of this address and email, and towards this
// address's failures across accounts; it locks no account.
func (s *Sessions) SignIn(ctx context.Context, ip netip.Addr, org, email, password string) (string, Session, error) {
	now := s.opt.Now()
	if err := s.guard.admit(now, ip, org, email); err != nil {
		return "", Session{}, err
	}
	u, err := s.verify.VerifyConsoleLogin(ctx, org, email, password)
	switch {
	case errors.Is(err, tenants.ErrNotFound):
		s.guard.failed(now, ip, org, email)
		return "", Session{}, ErrBadLogin
	case err != nil:
		return "", Session{}, fmt.Errorf("sign in: %w", err)
	}
	s.guard.succeeded(ip, org, email)
	return s.start(ctx, u, now)
}

// start starts a session of u.
func (s *Sessions) start(ctx context.Context, u tenants.ConsoleUser, now time.Time) (string, Session, error) {
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", Session{}, fmt.Errorf("session id: %w", err)
	}
	id := base64.RawURLEncoding.EncodeToString(raw)
	sess := Session{UserID: u.ID, Email: u.Email, OrgID: u.OrgID, Role: u.Role, CSRFToken: csrfToken(id),
		ExpiresAt: now.Add(s.opt.MaxAge).UTC().Truncate(time.Microsecond)}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
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

// ErrWrongPassword is a password change whose current password is wrong.
var ErrWrongPassword = derrors.New(derrors.Forbidden, "the current password is wrong")

// ChangePassword sets the password of the signed-in user of sess, who must give
// their current one (checked under the same limits as a sign-in from ip), ends every
// session of the user, this one included, and starts a new one: it returns the new
// session's id and the session. A new password that breaks the rules of a console
// password is an Invalid error naming new_password.
func (s *Sessions) ChangePassword(ctx context.Context, ip netip.Addr, sess Session, current, next string) (string, Session, error) {
	now := s.opt.Now()
	if err := s.guard.admit(now, ip, sess.OrgID, sess.Email); err != nil {
		return "", Session{}, err
	}
	u, err := s.verify.VerifyConsoleLogin(ctx, sess.OrgID, sess.Email, current)
	switch {
	case errors.Is(err, tenants.ErrNotFound):
		s.guard.failed(now, ip, sess.OrgID, sess.Email)
		return "", Session{}, ErrWrongPassword
	case err != nil:
		return "", Session{}, fmt.Errorf("change password: %w", err)
	}
	s.guard.succeeded(ip, sess.OrgID, sess.Email)
	if err := s.verify.SetConsolePassword(ctx, tenants.Actor{Name: "console:" + u.Email}, u.OrgID, u.Email, next); err != nil {
		var ve *tenants.ValidationError
		if errors.As(err, &ve) { // the rules of a new password, named as this route's field
			var fields []derrors.FieldError
			for _, f := range ve.Fields {
				if f.Field == "password" {
					fields = append(fields, derrors.FieldError{Field: "new_password", Message: f.Message})
				}
			}
			return "", Session{}, derrors.E(derrors.Invalid, "the new password breaks a rule", err, fields...)
		}
		return "", Session{}, fmt.Errorf("change password: %w", err)
	}
	return s.start(ctx, u, now)
}

// Lookup returns the live session of id, ending it (ErrNoSession) when it is past its
// absolute or idle expiry. The user's current role and org are read each time, so a
// changed or deleted console user takes effect at once.
func (s *Sessions) Lookup(ctx context.Context, id string) (Session, error) {
	// A session id is 32 bytes, base64url: anything else names none, without a query.
	if raw, err := base64.RawURLEncoding.DecodeString(id); err != nil || len(raw) != 32 {
		return Session{}, ErrNoSession
	}
	now := s.opt.Now()
	h := hashID(id)
	if s.unknown.Contains(string(h)) {
		return Session{}, ErrNoSession
	}
	var sess Session
	var lastSeen time.Time
	err := s.pool.QueryRow(ctx, `SELECT u.id, u.email, u.org_id, u.role, s.expires_at, s.last_seen_at
		FROM console_sessions s JOIN console_users u ON u.id = s.user_id WHERE s.id_hash = $1`, h).
		Scan(&sess.UserID, &sess.Email, &sess.OrgID, &sess.Role, &sess.ExpiresAt, &lastSeen)
	if errors.Is(err, pgx.ErrNoRows) {
		s.unknown.Add(string(h), struct{}{})
		return Session{}, ErrNoSession
	}
	if err != nil {
		return Session{}, fmt.Errorf("look up session: %w", err)
	}
	if !now.Before(sess.ExpiresAt) || !now.Before(lastSeen.Add(s.opt.IdleTimeout)) {
		_, _ = s.pool.Exec(ctx, `DELETE FROM console_sessions WHERE id_hash = $1`, h)
		s.unknown.Add(string(h), struct{}{})
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
