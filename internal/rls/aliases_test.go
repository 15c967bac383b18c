package rls_test

import (
	"testing"

	"github.com/quotaplane/quotaplane/internal/config"
	"github.com/quotaplane/quotaplane/internal/rls"
)

// QUOTA_GRPC_DESCRIPTOR_ALIASES is parsed in config, which cannot import this package:
// the entry keys its parser knows are this package's, and no other.
func TestAliasesStandForTheEntryKeys(t *testing.T) {
	t.Parallel()
	for _, key := range []string{rls.KeyOrg, rls.KeyTeam, rls.KeyUser, rls.KeyMetric} {
		if got, err := config.ParseAliases("x-alias=" + key); err != nil || got["x-alias"] != key {
			t.Errorf("ParseAliases(x-alias=%s) = %v, %v", key, got, err)
		}
		if _, err := config.ParseAliases(key + "=" + rls.KeyUser); err == nil {
			t.Errorf("ParseAliases(%s=user) accepted an entry key as an alias", key)
		}
	}
	if _, err := config.ParseAliases("x-alias=tenant"); err == nil {
		t.Error("ParseAliases(x-alias=tenant) accepted a key that is no entry key")
	}
}
