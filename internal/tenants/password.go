package tenants

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"runtime"
	"strings"

	"golang.org/x/crypto/argon2"
)

// passwordHasher hashes console passwords with argon2id, encoded in the PHC string
// format ($argon2id$v=19$m=...,t=...,p=...$salt$hash) so parameters can change
// without invalidating stored hashes.
//
// Each hash holds memory KiB (19 MiB by default) and a CPU for tens of milliseconds,
// so the process runs at most cap(slots) at once: a hash that finds every slot taken
// fails at once with ErrPasswordBusy (503, Retry-After) instead of queueing. That
// bounds the memory of password hashing to cap(slots) x memory whatever callers do: a
// flood of sign-ins cannot take the api's memory.
type passwordHasher struct {
	memory     uint32 // KiB
	iterations uint32
	slots      chan struct{} // one token per hash running; nil: unbounded (not used)
}

// defaultHasher follows OWASP's argon2id recommendation (19 MiB, 2 iterations, 1 lane).
func defaultHasher() passwordHasher {
	return passwordHasher{memory: 19 * 1024, iterations: 2, slots: make(chan struct{}, DefaultPasswordHashes())}
}

// DefaultPasswordHashes is how many password hashes a process runs at once unless
// told otherwise (QUOTA_PASSWORD_HASHES): half of GOMAXPROCS (which follows a
// container's CPU limit), at least 1 and at most 4. Half, so hashing can never take
// every CPU from the checks; at most 4, so the hashes hold at most 76 MiB.
func DefaultPasswordHashes() int { return min(max(runtime.GOMAXPROCS(0)/2, 1), 4) }

// acquire takes a hash slot, or fails with ErrPasswordBusy when none is free.
func (h passwordHasher) acquire() (release func(), err error) {
	if h.slots == nil {
		return func() {}, nil
	}
	select {
	case h.slots <- struct{}{}:
		return func() { <-h.slots }, nil
	default:
		return nil, ErrPasswordBusy
	}
}

// hash hashes password in a slot (ErrPasswordBusy when none is free).
func (h passwordHasher) hash(password string) (string, error) {
	release, err := h.acquire()
	if err != nil {
		return "", err
	}
	defer release()
	salt := make([]byte, 16)
	if _, err := rand.Read(salt); err != nil {
		return "", err
	}
	key := argon2.IDKey([]byte(password), salt, h.iterations, h.memory, 1, 32)
	b64 := base64.RawStdEncoding
	return fmt.Sprintf("$argon2id$v=%d$m=%d,t=%d,p=1$%s$%s", argon2.Version, h.memory, h.iterations,
		b64.EncodeToString(salt), b64.EncodeToString(key)), nil
}

// verify reports whether password matches an encoded argon2id hash, computed in a
// slot (ErrPasswordBusy when none is free).
func (h passwordHasher) verify(encoded, password string) (bool, error) {
	release, err := h.acquire()
	if err != nil {
		return false, err
	}
	defer release()
	return verifyPassword(encoded, password), nil
}

// verifyPassword reports whether password matches an encoded argon2id hash.
func verifyPassword(encoded, password string) bool {
	parts := strings.Split(encoded, "$")
	if len(parts) != 6 || parts[1] != "argon2id" {
		return false
	}
	var mem, iter uint32
	var lanes uint8
	if _, err := fmt.Sscanf(parts[3], "m=%d,t=%d,p=%d", &mem, &iter, &lanes); err != nil {
		return false
	}
	b64 := base64.RawStdEncoding
	salt, err1 := b64.DecodeString(parts[4])
	want, err2 := b64.DecodeString(parts[5])
	if err1 != nil || err2 != nil {
		return false
	}
	got := argon2.IDKey([]byte(password), salt, iter, mem, lanes, uint32(len(want)))
	return subtle.ConstantTimeCompare(got, want) == 1
}
