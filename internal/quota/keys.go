package quota

import (
	"fmt"
	"strings"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Key layout (KEYS.md has the full story and the memory measurements). Every key of
// an org starts with "<prefix>:{<org>}|": the braces make the org the Redis Cluster
// hash tag, so all keys one check touches live in one slot, and '|' separates the
// parts because ids may contain '.', ':', '@' and '-' but never '|'.
//
//	<prefix>:{<org>}|m|<period>          hash: month counters, one field per counter,
//	                                     and the period marker field "|p"
//	<prefix>:{<org>}|d|<period>          set: month counter fields changed since the last drain
//	<prefix>:{<org>}|w|<seconds>|<bucket> hash: sliding-window bucket, field per counter
//	<prefix>:{<org>}|i|<idempotency key> string: '#', the first request's fingerprint
//	                                     and its decision's reply, 24 h
//	<prefix>:{<org>}|b|<period>          hash: would-block record (wouldblock.go, KEYS.md)
//	<prefix>:{<org>}|s|<replica>         string: an engine's last would-block batch applied
//
// Counter fields: <metric>|o, <metric>|t|<team>, <metric>|u|<team>|<user>.

// markerField in an org's month hash says its counters for the period are complete
// (hydrated). Being a field of the hash, it cannot outlive the counters: a hash that
// is lost or evicted takes the marker with it, and the next check rehydrates.
const markerField = "|p"

// orgTag returns the common start of an org's keys.
func orgTag(prefix, org string) string { return prefix + ":{" + org + "}|" }

// parseField turns a counter field back into a Counter.
func parseField(f string) (Counter, error) {
	metric, rest, ok := strings.Cut(f, "|")
	if ok {
		letter, ids, _ := strings.Cut(rest, "|")
		switch letter {
		case "o":
			if ids == "" {
				return Counter{Metric: metric, Level: vocab.LevelOrg}, nil
			}
		case "t":
			if ids != "" && !strings.Contains(ids, "|") {
				return Counter{Metric: metric, Level: vocab.LevelTeam, Team: ids}, nil
			}
		case "u":
			if team, user, ok := strings.Cut(ids, "|"); ok && team != "" && user != "" {
				return Counter{Metric: metric, Level: vocab.LevelUser, Team: team, User: user}, nil
			}
		}
	}
	return Counter{}, fmt.Errorf("quota: malformed counter field %q", f)
}
