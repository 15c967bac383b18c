package webhooks

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/quotaplane/quotaplane/internal/tenants"
)

// An org's signing secret. Until its first rotation an org signs with the derived
// SigningSecret(QUOTA_WEBHOOK_SECRET, org), so receivers set up with the derived secret
// keep working; a rotation gives it a random secret of its own (org_webhook_secrets),
// and the one it replaces still signs, beside the new one, for SecretGrace. Rotating
// again within the grace drops the older of the two at once: at most two secrets sign a
// delivery.
//
// The table holds the secrets sealed (AES-256-GCM under a key derived from
// QUOTA_WEBHOOK_SECRET, the org id as additional data), so a reader of the database
// (a backup, a replica) cannot forge an org's webhooks, as it could not when every
// secret was derived. A server with another QUOTA_WEBHOOK_SECRET cannot open them:
// changing it changes every org's secret, rotated or not.

// SecretGrace is how long an org's previous signing secret still signs its
// deliveries after a rotation.
const SecretGrace = 24 * time.Hour

// RotatedSecret is the answer to a rotation: the new secret (shown this once) and
// when the previous one stops signing.
type RotatedSecret struct {
	Secret        string
	PreviousUntil time.Time
}

// newSecret is 32 random bytes, hex, as long as a derived secret.
func newSecret() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// sealKey is the AES-256 key secrets are sealed with, derived from master.
func sealKey(master []byte) cipher.AEAD {
	m := hmac.New(sha256.New, master)
	m.Write([]byte("quotaplane webhook secret seal v1"))
	block, _ := aes.NewCipher(m.Sum(nil)) // 32 bytes: cannot fail
	aead, _ := cipher.NewGCM(block)       // a standard block size: cannot fail
	return aead
}

// seal encrypts org's secret for org_webhook_secrets: base64 of nonce and ciphertext.
func seal(master []byte, org, secret string) (string, error) {
	aead := sealKey(master)
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return "", err
	}
	return base64.RawStdEncoding.EncodeToString(aead.Seal(nonce, nonce, []byte(secret), []byte(org))), nil
}

// unseal opens what seal wrote for org.
func unseal(master []byte, org, sealed string) (string, error) {
	aead := sealKey(master)
	b, err := base64.RawStdEncoding.DecodeString(sealed)
	if err == nil && len(b) < aead.NonceSize() {
		err = errors.New("too short")
	}
	var plain []byte
	if err == nil {
		plain, err = aead.Open(nil, b[:aead.NonceSize()], b[aead.NonceSize():], []byte(org))
	}
	if err != nil {
		return "", fmt.Errorf("the webhook signing secret of org %s cannot be opened (was QUOTA_WEBHOOK_SECRET changed? rotate the org's secret again): %w", org, err)
	}
	return string(plain), nil
}

// signingSecrets returns the secrets org's deliveries are signed with at now, the
// current first: its own or the derived one, then the previous while it is valid.
func (s *Store) signingSecrets(ctx context.Context, master []byte, org string, now time.Time) ([]string, error) {
	var cur string
	var prev *string
	var until *time.Time
	err := s.pool.QueryRow(ctx, `SELECT secret, previous, previous_until FROM org_webhook_secrets WHERE org_id = $1`, org).
		Scan(&cur, &prev, &until)
	if errors.Is(err, pgx.ErrNoRows) {
		return []string{SigningSecret(master, org)}, nil
	}
	if err != nil {
		return nil, err
	}
	c, err := unseal(master, org, cur)
	if err != nil {
		return nil, err
	}
	out := []string{c}
	if prev != nil && until != nil && now.Before(*until) {
		p, err := unseal(master, org, *prev)
		if err != nil {
			return nil, err
		}
		if p != c {
			out = append(out, p)
		}
	}
	return out, nil
}

// rotateSecret gives org a new random secret; its current one (derived when it has
// none of its own) becomes the previous, valid until now+grace. The audit row
// (webhook.secret.rotate, with the expiry and no secret) is in the same transaction.
func (s *Store) rotateSecret(ctx context.Context, a tenants.Actor, master []byte, org string, now time.Time, grace time.Duration) (RotatedSecret, error) {
	secret, err := newSecret()
	if err != nil {
		return RotatedSecret{}, err
	}
	until := now.Add(grace).UTC().Truncate(time.Microsecond)
	sealedNew, err := seal(master, org, secret)
	if err != nil {
		return RotatedSecret{}, err
	}
	sealedDerived, err := seal(master, org, SigningSecret(master, org))
	if err != nil {
		return RotatedSecret{}, err
	}
	// One statement: two rotations at once both land, the later one's previous being
	// the earlier one's secret.
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO org_webhook_secrets (org_id, secret, previous, previous_until, rotated_at)
		VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (org_id) DO UPDATE SET previous = org_webhook_secrets.secret,
			previous_until = EXCLUDED.previous_until, secret = EXCLUDED.secret, rotated_at = EXCLUDED.rotated_at`,
			org, sealedNew, sealedDerived, until, now); err != nil {
			return err
		}
		return tenants.AuditTx(ctx, tx, a, org, "webhook.secret.rotate", "org:"+org, nil,
			map[string]any{"previous_expires_at": until})
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23503" { // the org was removed meanwhile
		return RotatedSecret{}, tenants.ErrNotFound
	}
	if err != nil {
		return RotatedSecret{}, err
	}
	return RotatedSecret{Secret: secret, PreviousUntil: until}, nil
}

// RotateSecret gives org a new random signing secret, returned this once, and keeps
// the one it replaces signing for Grace (SecretGrace when 0): deliveries meanwhile
// carry both signatures. a is audited as its author.
//
// Errors: tenants.ErrNotFound for an unknown org; ErrNoSigningKey when the server has
// no QUOTA_WEBHOOK_SECRET (no webhook is sent at all).
func (s *Service) RotateSecret(ctx context.Context, a tenants.Actor, org string) (RotatedSecret, error) {
	if _, err := s.Tenants.GetOrg(ctx, org); err != nil {
		return RotatedSecret{}, err
	}
	if len(s.Secret) == 0 {
		return RotatedSecret{}, ErrNoSigningKey
	}
	grace := s.Grace
	if grace <= 0 {
		grace = SecretGrace
	}
	return s.Store.rotateSecret(ctx, a, s.Secret, org, s.now(), grace)
}

func (s *Service) now() time.Time {
	if s.Clock != nil {
		return s.Clock()
	}
	return time.Now()
}
