package tenants

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"strings"

	"golang.org/x/crypto/argon2"
)

// passwordHasher hashes console passwords with argon2id, encoded in the PHC string
// format ($argon2id$v=19$m=...,t=...,p=...$salt$hash) so parameters can change
// without invalidating stored hashes.
type passwordHasher struct {
	memory     uint32 // KiB
	iterations uint32
}

// defaultHasher follows OWASP's argon2id recommendation (19 MiB, 2 iterations, 1 lane).
var defaultHasher = passwordHasher{memory: 19 * 1024, iterations: 2}

func (h passwordHasher) hash(password string) (string, error) {
	salt := make([]byte, 16)
	if _, err := rand.Read(salt); err != nil {
		return "", err
	}
	key := argon2.IDKey([]byte(password), salt, h.iterations, h.memory, 1, 32)
	b64 := base64.RawStdEncoding
	return fmt.Sprintf("$argon2id$v=%d$m=%d,t=%d,p=1$%s$%s", argon2.Version, h.memory, h.iterations,
		b64.EncodeToString(salt), b64.EncodeToString(key)), nil
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
