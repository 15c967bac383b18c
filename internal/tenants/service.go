package tenants

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/platform/pgdb"
)

// Service is the tenancy model over Postgres. Every method that changes something
// validates its input, runs in one transaction with the allocation rules and the audit
// row, and reports the orgs it changed to the Changed hook after commit.
//
// Service and its store are one type on purpose: the allocation rules must be checked
// on data read under the parent's row lock in the write's own transaction, so a store
// interface would have to expose transactions anyway.
type Service struct {
	pool      pgdb.DB // its errors match derrors.Unavailable when Postgres is down
	hasher    passwordHasher
	listeners []func(orgIDs ...string)
	now       func() time.Time
	uses      *keyUses // keys authenticated since the last FlushKeyUses
	maxKeys   int      // active API keys an org may hold
	keyTokens KeyTokens
}

// Option configures a Service.
type Option func(*Service)

// WithChangeHook sets a function called after each committed change with the ids of
// the orgs whose resolved limits, keys or settings may have changed. Plan changes
// name every org on the plan.
func WithChangeHook(fn func(orgIDs ...string)) Option { return func(s *Service) { s.OnChange(fn) } }

// OnChange adds a function called after each committed change with the ids of the
// orgs it touched. Register listeners before serving; they must not block.
func (s *Service) OnChange(fn func(orgIDs ...string)) { s.listeners = append(s.listeners, fn) }

func (s *Service) changed(orgIDs ...string) {
	for _, fn := range s.listeners {
		fn(orgIDs...)
	}
}

// WithClock sets the time source against which grants are made and lapse (default
// time.Now). Tests move it by hand.
func WithClock(now func() time.Time) Option { return func(s *Service) { s.now = now } }

// WithPasswordCost lowers the password hashing cost. Tests only.
func WithPasswordCost(memoryKiB uint32, iterations uint32) Option {
	return func(s *Service) { s.hasher.memory, s.hasher.iterations = memoryKiB, iterations }
}

// WithPasswordHashes bounds the password hashes (sign-ins, password changes, new
// console users) the Service runs at once to n (QUOTA_PASSWORD_HASHES; default
// DefaultPasswordHashes); one more fails with ErrPasswordBusy. n <= 0 keeps the
// default.
func WithPasswordHashes(n int) Option {
	return func(s *Service) {
		if n > 0 {
			s.hasher.slots = make(chan struct{}, n)
		}
	}
}

// WithMaxKeysPerOrg caps the active API keys of one org (QUOTA_MAX_KEYS_PER_ORG,
// default DefaultMaxKeysPerOrg): creating one more fails with ErrKeyCap. The admin
// rate limit is per key as well as per org, so the cap also bounds what one org's
// keys can ask of the admin API. n <= 0 keeps the default.
func WithMaxKeysPerOrg(n int) Option {
	return func(s *Service) {
		if n > 0 {
			s.maxKeys = n
		}
	}
}

// KeyTokens makes the public id and the secret of a new API key of an org.
type KeyTokens func(orgID string) (id [8]byte, secret [32]byte, err error)

// WithKeyTokens sets where the ids and secrets of new API keys come from, for
// CreateAPIKey and ImportOrgs alike (by default 64 and 256 bits from crypto/rand).
// A token made from a known source is known to whoever knows the source: only a tool
// that must rebuild its keys' tokens from their orgs sets it (internal/scale, whose
// load scripts do), never a server.
func WithKeyTokens(fn KeyTokens) Option { return func(s *Service) { s.keyTokens = fn } }

// DefaultMaxKeysPerOrg is the default cap on an org's active API keys.
const DefaultMaxKeysPerOrg = 100

// NewService returns a Service on pool.
func NewService(pool *pgxpool.Pool, opts ...Option) *Service {
	s := &Service{pool: pgdb.DB{Pool: pool}, hasher: defaultHasher(), maxKeys: DefaultMaxKeysPerOrg, now: time.Now, uses: &keyUses{ids: map[string]struct{}{}}}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Ping reports whether Postgres answers.
func (s *Service) Ping(ctx context.Context) error { return s.pool.Ping(ctx) }

// querier is what both the pool and a transaction offer.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// inTx runs fn in a transaction, retrying it when Postgres reports a serialization
// failure or a deadlock (both are safe to retry: nothing was committed).
func (s *Service) inTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	for attempt := 0; ; attempt++ {
		err := pgx.BeginFunc(ctx, s.pool, fn)
		var pgErr *pgconn.PgError
		if attempt < 5 && errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01") {
			continue
		}
		return pgdb.Translate(err)
	}
}

// translate maps database errors to the package's error kinds by SQLSTATE, saying
// what failed (`team "eng" of org "acme"`): the caller of the API is told
// `team "eng" of org "acme" not found` (derrors.Wrap).
func translate(err error, what string) error {
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, pgx.ErrNoRows):
		return derrors.Wrap(ErrNotFound, "%s", what)
	case errors.As(err, &pgErr) && pgErr.Code == "23505": // unique_violation
		return derrors.Wrap(ErrExists, "%s", what)
	case errors.As(err, &pgErr) && pgErr.Code == "23503": // foreign_key_violation
		return derrors.Wrap(ErrNotFound, "%s", what)
	}
	return derrors.Wrap(err, "%s", what)
}

// Now is the service's clock: the time against which grants are made and lapse.
func (s *Service) Now() time.Time { return s.now() }
