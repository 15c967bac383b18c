package tenants

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/internal/derrors"
)

// Tokens of org API keys look like qpk_<id>_<secret>: the id (16 hex digits) is public
// and finds the row; the secret is 256 random bits, base64url. Only the SHA-256 digest
// of the whole token is stored.
const tokenPrefix = "qpk_"

// ErrBadToken: the token is malformed, unknown, revoked or does not match.
var ErrBadToken = derrors.New(derrors.Unauthenticated, "invalid API key")

func newToken() (id, token string, err error) {
	var idb [8]byte
	var secret [32]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return "", "", err
	}
	if _, err := rand.Read(secret[:]); err != nil {
		return "", "", err
	}
	id, token = formatToken(idb, secret)
	return id, token, nil
}

// newToken makes the id and token of a new API key of org, from s's KeyTokens when
// it has them.
func (s *Service) newToken(orgID string) (id, token string, err error) {
	if s.keyTokens == nil {
		return newToken()
	}
	idb, secret, err := s.keyTokens(orgID)
	if err != nil {
		return "", "", err
	}
	id, token = formatToken(idb, secret)
	return id, token, nil
}

// keyColumns are what api_keys stores of a new key with token: the token's first
// characters, which the key's owner recognizes it by, the SHA-256 digest of the whole
// token (never the token itself) and the scopes.
func keyColumns(token string, in APIKeyInput) (prefix string, digest [32]byte, scopes []string) {
	scopes = make([]string, len(in.Scopes))
	for i, sc := range in.Scopes {
		scopes[i] = string(sc)
	}
	return token[:len(tokenPrefix)+8], sha256.Sum256([]byte(token)), scopes
}

// formatToken is the token of a key id and secret.
func formatToken(idb [8]byte, secret [32]byte) (id, token string) {
	id = hex.EncodeToString(idb[:])
	return id, tokenPrefix + id + "_" + base64.RawURLEncoding.EncodeToString(secret[:])
}

// tokenChars maps a byte to its value as a digit of the id (lower-case hex: 0..15)
// and of the secret (base64url: 0..63), or -1.
var tokenChars = func() (t [256]struct{ hex, b64 int8 }) {
	for i := range t {
		t[i].hex, t[i].b64 = -1, -1
	}
	for i, c := range "0123456789abcdef" {
		t[c].hex = int8(i)
	}
	for i, c := range "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_" {
		t[c].b64 = int8(i)
	}
	return t
}()

// parseToken returns the key id of a token that has exactly the shape formatToken
// makes: qpk_, 16 lower-case hex digits, '_' and 43 base64url digits whose last 2
// bits are zero (32 bytes encode to 256 of their 258 bits).
func parseToken(token string) (string, bool) {
	rest, ok := strings.CutPrefix(token, tokenPrefix)
	if !ok || len(rest) != 16+1+43 || rest[16] != '_' {
		return "", false
	}
	for i := range 16 {
		if tokenChars[rest[i]].hex < 0 {
			return "", false
		}
	}
	for i := 17; i < len(rest); i++ {
		if tokenChars[rest[i]].b64 < 0 {
			return "", false
		}
	}
	if tokenChars[rest[len(rest)-1]].b64&3 != 0 {
		return "", false
	}
	return rest[:16], true
}

// LooksLikeAPIKey reports whether token has the shape of an org API key, so callers
// can tell it from the operator token without a lookup.
func LooksLikeAPIKey(token string) bool {
	_, ok := parseToken(token)
	return ok
}

const keyCols = `id, org_id, name, prefix, scopes, created_at, last_used_at, revoked_at`

func scanKey(row pgx.Row) (APIKey, error) {
	var k APIKey
	var scopes []string
	err := row.Scan(&k.ID, &k.OrgID, &k.Name, &k.Prefix, &scopes, &k.CreatedAt, &k.LastUsedAt, &k.RevokedAt)
	for _, s := range scopes {
		k.Scopes = append(k.Scopes, Scope(s))
	}
	return k, err
}

// CreateAPIKey creates a key for an org and returns it with its token, which is never
// shown again.
func (s *Service) CreateAPIKey(ctx context.Context, a Actor, orgID string, in APIKeyInput) (APIKey, string, error) {
	if err := in.Validate(); err != nil {
		return APIKey{}, "", err
	}
	id, token, err := s.newToken(orgID)
	if err != nil {
		return APIKey{}, "", fmt.Errorf("create API key: %w", err)
	}
	prefix, digest, scopes := keyColumns(token, in)
	var out APIKey
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := getOrg(ctx, tx, orgID, s.now()); err != nil {
			return err
		}
		if err := s.underKeyCap(ctx, tx, orgID); err != nil {
			return err
		}
		out, err = scanKey(tx.QueryRow(ctx, `INSERT INTO api_keys (id, org_id, name, prefix, digest, scopes)
			VALUES ($1, $2, $3, $4, $5, $6) RETURNING `+keyCols, id, orgID, in.Name, prefix, digest[:], scopes))
		if err != nil {
			return translate(err, "create API key")
		}
		return audit(ctx, tx, a, orgID, "api_key.create", "api_key:"+id, nil, out)
	})
	if err != nil {
		return APIKey{}, "", err
	}
	return out, token, nil
}

// underKeyCap fails with ErrKeyCap when org already holds s.maxKeys active keys. It
// locks the org's row first, so concurrent creations are counted one after another
// and the cap holds exactly.
func (s *Service) underKeyCap(ctx context.Context, tx pgx.Tx, orgID string) error {
	var n int
	if _, err := tx.Exec(ctx, `SELECT 1 FROM orgs WHERE id = $1 FOR UPDATE`, orgID); err != nil {
		return fmt.Errorf("lock org %q: %w", orgID, err)
	}
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM api_keys WHERE org_id = $1 AND revoked_at IS NULL`, orgID).Scan(&n); err != nil {
		return fmt.Errorf("count API keys of org %q: %w", orgID, err)
	}
	if n >= s.maxKeys {
		return derrors.E(derrors.Unprocessable, fmt.Sprintf("org %q already holds %d active API keys, the most one org may hold "+
			"(QUOTA_MAX_KEYS_PER_ORG); revoke one before creating another", orgID, n), ErrKeyCap,
			derrors.FieldError{Field: "org", Message: fmt.Sprintf("holds %d active API keys, the cap", n)})
	}
	return nil
}

// ListAPIKeys returns one page of an org's keys ordered by id, revoked ones included.
func (s *Service) ListAPIKeys(ctx context.Context, orgID string, page Page) ([]APIKey, string, error) {
	if _, err := getOrg(ctx, s.pool, orgID, s.now()); err != nil {
		return nil, "", err
	}
	return listPage(ctx, s.pool, "API keys", page, `SELECT `+keyCols+` FROM api_keys WHERE org_id = $1 AND id > $2 ORDER BY id LIMIT $3`,
		scanKey, func(k APIKey) string { return k.ID }, orgID)
}

// RevokeAPIKey revokes a key of an org. Revoking a revoked key changes nothing.
func (s *Service) RevokeAPIKey(ctx context.Context, a Actor, orgID, keyID string) error {
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		before, err := scanKey(tx.QueryRow(ctx, `SELECT `+keyCols+` FROM api_keys WHERE org_id = $1 AND id = $2 FOR UPDATE`, orgID, keyID))
		if err != nil {
			return translate(err, fmt.Sprintf("API key %q", keyID))
		}
		if before.RevokedAt != nil {
			return nil
		}
		after, err := scanKey(tx.QueryRow(ctx, `UPDATE api_keys SET revoked_at = now() WHERE id = $1 RETURNING `+keyCols, keyID))
		if err != nil {
			return err
		}
		return audit(ctx, tx, a, orgID, "api_key.revoke", "api_key:"+keyID, before, after)
	})
	if err == nil {
		s.changed(orgID)
	}
	return err
}

// Authenticate returns the live key a token belongs to, or ErrBadToken. The digest
// comparison takes constant time. It writes nothing: a key whose last_used_at is
// more than a minute old is noted, and RecordKeyUses writes the notes in batches.
func (s *Service) Authenticate(ctx context.Context, token string) (APIKey, error) {
	id, ok := parseToken(token)
	if !ok {
		return APIKey{}, ErrBadToken
	}
	var k APIKey
	var digest []byte
	var scopes []string
	err := s.pool.QueryRow(ctx, `SELECT `+keyCols+`, digest FROM api_keys WHERE id = $1`, id).
		Scan(&k.ID, &k.OrgID, &k.Name, &k.Prefix, &scopes, &k.CreatedAt, &k.LastUsedAt, &k.RevokedAt, &digest)
	if errors.Is(err, pgx.ErrNoRows) {
		return APIKey{}, ErrBadToken
	}
	if err != nil {
		return APIKey{}, fmt.Errorf("look up API key: %w", err)
	}
	want := sha256.Sum256([]byte(token))
	if subtle.ConstantTimeCompare(want[:], digest) != 1 || k.RevokedAt != nil {
		return APIKey{}, ErrBadToken
	}
	for _, sc := range scopes {
		k.Scopes = append(k.Scopes, Scope(sc))
	}
	if k.LastUsedAt == nil || s.now().Sub(*k.LastUsedAt) > time.Minute {
		s.uses.note(id)
	}
	return k, nil
}

// LiveKeys reports which of the key ids given are live (exist and are not revoked),
// in one query however many there are: what a cache needs to keep serving keys it
// authenticated earlier. Like Authenticate, it notes the uses of the live keys whose
// last_used_at is more than a minute old.
func (s *Service) LiveKeys(ctx context.Context, ids []string) (map[string]bool, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, last_used_at FROM api_keys WHERE id = ANY($1) AND revoked_at IS NULL`, ids)
	if err != nil {
		return nil, fmt.Errorf("look up API keys: %w", err)
	}
	defer rows.Close()
	live := make(map[string]bool, len(ids))
	now := s.now()
	for rows.Next() {
		var id string
		var used *time.Time
		if err := rows.Scan(&id, &used); err != nil {
			return nil, fmt.Errorf("look up API keys: %w", err)
		}
		live[id] = true
		if used == nil || now.Sub(*used) > time.Minute {
			s.uses.note(id)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("look up API keys: %w", err)
	}
	return live, nil
}

// keyUses are the ids of keys authenticated since the last flush whose last_used_at
// was stale: at most the number of live keys, since only a key whose digest matched is
// noted.
type keyUses struct {
	mu  sync.Mutex
	ids map[string]struct{}
}

func (u *keyUses) note(id string) {
	u.mu.Lock()
	u.ids[id] = struct{}{}
	u.mu.Unlock()
}

func (u *keyUses) take() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.ids) == 0 {
		return nil
	}
	ids := make([]string, 0, len(u.ids))
	for id := range u.ids {
		ids = append(ids, id)
	}
	clear(u.ids)
	return ids
}

// FlushKeyUses sets last_used_at of the keys noted since the last flush, in one
// statement, off the check path. The notes of a flush that fails are kept for the
// next.
func (s *Service) FlushKeyUses(ctx context.Context) error {
	ids := s.uses.take()
	if len(ids) == 0 {
		return nil
	}
	if _, err := s.pool.Exec(ctx, `UPDATE api_keys SET last_used_at = now() WHERE id = ANY($1)`, ids); err != nil {
		for _, id := range ids {
			s.uses.note(id)
		}
		return fmt.Errorf("record key use: %w", err)
	}
	return nil
}

// RecordKeyUses flushes the noted key uses every interval until ctx ends, and once
// more then (within 2 s). last_used_at is coarse: up to a minute stale plus interval.
func (s *Service) RecordKeyUses(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			_ = s.FlushKeyUses(ctx)
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			_ = s.FlushKeyUses(fctx)
			cancel()
			return
		}
	}
}
