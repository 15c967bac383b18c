package quota_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// crc16 is CRC16-XMODEM (polynomial 0x1021, initial value 0, no reflection), the
// checksum of the Redis Cluster specification's key distribution model.
func crc16(b []byte) uint16 {
	var crc uint16
	for _, c := range b {
		crc ^= uint16(c) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// hashTag is the part of key Redis Cluster hashes: between the first '{' and the
// first '}' after it, if that is not empty; otherwise the whole key.
func hashTag(key string) string {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			return key[s+1 : s+1+e]
		}
	}
	return key
}

func slot(key string) int { return int(crc16([]byte(hashTag(key)))) % 16384 }

func TestClusterSlot(t *testing.T) {
	if got := crc16([]byte("123456789")); got != 0x31C3 {
		t.Fatalf(`crc16("123456789") = %#x, the specification says 0x31C3`, got)
	}
	// CLUSTER KEYSLOT of a Redis 7 node.
	for key, want := range map[string]int{
		"foo": 12182, "123456789": 12739, "{user1000}.following": 3443, "foo{}{bar}": 8363,
		"foo{{bar}}zap": 4015, "q:{acme}|m|2026-11": 11304,
	} {
		if got := slot(key); got != want {
			t.Errorf("slot(%q) = %d, want %d", key, got, want)
		}
	}
}

// Every key a check touches, declared in KEYS or named by the script, has the org as
// its hash tag, so all are in the org's one Redis Cluster slot (no CROSSSLOT, and a
// slot migration moves an org whole). Whatever prefix or ids are tried, the engine
// either refuses them or keeps that property.
func FuzzCheckKeysShareOneSlot(f *testing.F) {
	f.Add("q", "acme", "eng", "alice", "requests", "order-12345", uint8(0x1f), int64(1_790_000_000_123), uint8(1))
	f.Add("", "a", "", "", "m", "", uint8(0x10), int64(0), uint8(0))
	f.Add("t-1:x", "org.with:colons@x-y", "t", "u", "tokens", "", uint8(0x0f), int64(4_102_444_800_000), uint8(28))
	f.Add("q{", "acme", "", "", "requests", "", uint8(1), int64(1), uint8(1))
	f.Add("q", "ac{me}", "", "", "requests", "", uint8(1), int64(1), uint8(1))
	f.Add("q}", "{acme}", "e}", "{u", "r{", "idem{key}", uint8(2), int64(86_400_000), uint8(3))
	f.Add("p|x", "acme", "eng", "", "requests", "12345678", uint8(4), int64(3_600_000), uint8(0))
	f.Fuzz(func(t *testing.T, prefix, org, team, user, metric, idem string, windows uint8, nowMs int64, anchor uint8) {
		req := quota.Request{Org: org, Team: team, User: user, Metric: metric, Cost: 1, IdempotencyKey: idem,
			AnchorDay: int(anchor % 29)}
		for i, w := range []vocab.Window{vocab.Second, vocab.Minute, vocab.Hour, vocab.Day, vocab.Month} {
			if windows&(1<<i) != 0 {
				l := vocab.Limit{Window: w, Limit: 10}
				req.Limits.Org = append(req.Limits.Org, l)
				if team != "" {
					req.Limits.Team = append(req.Limits.Team, l)
					if user != "" {
						req.Limits.User = append(req.Limits.User, l)
					}
				}
			}
		}
		// The engine's clock (corrected to Redis TIME) between 1970 and 2200.
		now := time.UnixMilli((nowMs%7_258_118_400_000 + 7_258_118_400_000) % 7_258_118_400_000)
		keys, err := quota.CheckKeys(prefix, req, now)
		if strings.ContainsAny(prefix, "{}") || strings.ContainsAny(org, "{}") {
			if err == nil {
				t.Fatalf("prefix %q, org %q with a brace accepted: %q", prefix, org, keys)
			}
		}
		if err != nil {
			if !errors.Is(err, quota.ErrInvalid) {
				t.Fatalf("refused with %v, want ErrInvalid", err)
			}
			return
		}
		nw := 0
		for _, w := range []vocab.Window{vocab.Second, vocab.Minute, vocab.Hour, vocab.Day} {
			if windows&(1<<map[vocab.Window]int{vocab.Second: 0, vocab.Minute: 1, vocab.Hour: 2, vocab.Day: 3}[w]) != 0 {
				nw++
			}
		}
		want := 3 + 2*nw // month, dirty, the dirty-org index
		if idem != "" {
			want++
		}
		if len(keys) != want {
			t.Fatalf("%d keys %q, want %d", len(keys), keys, want)
		}
		s := slot("{" + org + "}")
		for _, k := range keys {
			if strings.HasSuffix(k, "}|o") { // the dirty-org index of the org's slot: its tag is the slot's
				if got := slot(k); got != s {
					t.Fatalf("dirty-org index %q is in slot %d, the org's keys in %d", k, got, s)
				}
				continue
			}
			if tag := hashTag(k); tag != org {
				t.Fatalf("key %q hashes %q, not the org %q", k, tag, org)
			}
			if got := slot(k); got != s {
				t.Fatalf("key %q is in slot %d, the org's keys in %d (all keys: %q)", k, got, s, keys)
			}
		}
	})
}

// The key prefix may not carry a hash tag of its own (nor the part separator):
// New refuses it before it touches Redis.
func TestKeyPrefixRefusesBracesAndBars(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer rdb.Close()
	for _, p := range []string{"{", "}", "q{x}", "a}b", "{}", "a|b"} {
		e, err := quota.New(rdb, quota.Config{KeyPrefix: p})
		if !errors.Is(err, quota.ErrInvalid) {
			if e != nil {
				_ = e.Close()
			}
			t.Errorf("KeyPrefix %q: %v, want ErrInvalid", p, err)
		}
	}
}
