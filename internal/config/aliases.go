package config

import (
	"fmt"
	"strings"
)

// entryKeys are the entry keys a rate limit descriptor names its check with
// (internal/rls's KeyOrg, KeyTeam, KeyUser and KeyMetric).
var entryKeys = map[string]bool{"org": true, "team": true, "user": true, "metric": true}

// ParseAliases reads QUOTA_GRPC_DESCRIPTOR_ALIASES, "x-user-id=user,tenant=org": each
// alias names the entry key of a rate limit descriptor (org, team, user or metric:
// internal/rls's KeyOrg, KeyTeam, KeyUser and KeyMetric) it stands for.
func ParseAliases(s string) (map[string]string, error) {
	out := map[string]string{}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		alias, key, ok := strings.Cut(part, "=")
		alias, key = strings.TrimSpace(alias), strings.TrimSpace(key)
		switch {
		case !ok || alias == "":
			return nil, fmt.Errorf("%q: want alias=key, such as x-user-id=user", part)
		case !entryKeys[key]:
			return nil, fmt.Errorf("%q: an alias stands for org, team, user or metric, not %q", part, key)
		case entryKeys[alias]:
			return nil, fmt.Errorf("%q: %s is an entry key already and cannot be an alias", part, alias)
		}
		if _, dup := out[alias]; dup {
			return nil, fmt.Errorf("alias %q given twice", alias)
		}
		out[alias] = key
	}
	return out, nil
}
