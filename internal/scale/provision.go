package scale

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// OrgID names the i-th provisioned org.
func OrgID(i int) string { return fmt.Sprintf("scale-%07d", i) }

// Token is the check key of the i-th provisioned org: its id is i, its secret
// SHA-256("scale-secret-<i>"), so a load script (or MeasureCache) rebuilds any org's
// token from its number.
func Token(i int) string {
	return fmt.Sprintf("qpk_%016x_%s", i, base64.RawURLEncoding.EncodeToString(secret(i)))
}

func secret(i int) []byte {
	sum := sha256.Sum256(fmt.Appendf(nil, "scale-secret-%d", i))
	return sum[:]
}

// keyTokens makes the key of org OrgID(i) as Token(i) says.
func keyTokens(orgID string) (id [8]byte, sec [32]byte, err error) {
	i, err := strconv.Atoi(strings.TrimPrefix(orgID, "scale-"))
	if err != nil || OrgID(i) != orgID {
		return id, sec, fmt.Errorf("%q is not an org of scale", orgID)
	}
	binary.BigEndian.PutUint64(id[:], uint64(i))
	copy(sec[:], secret(i))
	return id, sec, nil
}

// Provision creates n orgs on one plan, each with 5 teams (t0 to t4) and a check
// key, Token(i), through tenants.Service.ImportOrgs: validated and audited as the
// admin API would create them, in bulk.
func Provision(ctx context.Context, pool *pgxpool.Pool, n int) error {
	svc := tenants.NewService(pool, tenants.WithKeyTokens(keyTokens))
	a := tenants.Actor{Name: "operator", RequestID: "scale"}
	if _, err := svc.CreatePlan(ctx, a, tenants.PlanInput{ID: "scale", Name: "Scale", FailMode: vocab.FailOpen,
		Limits: []vocab.Limit{{Metric: "requests", Window: vocab.Month, Limit: 1_000_000_000}},
		Pricing: &tenants.Pricing{Currency: "EUR", BasePrice: "10",
			Metrics: []tenants.MetricPrice{{Metric: "requests", IncludedUnits: 1000, OveragePrice: "0.01"}}}}); err != nil {
		return fmt.Errorf("provision: %w", err)
	}
	teams := make([]tenants.TeamInput, 5) // shared by every org: the import only reads it
	for t := range teams {
		teams[t] = tenants.TeamInput{ID: fmt.Sprintf("t%d", t), Name: fmt.Sprintf("Team %d", t)}
	}
	key := tenants.APIKeyInput{Name: "scale", Scopes: []tenants.Scope{tenants.ScopeCheck}}
	orgs := make([]tenants.NewOrg, n)
	for i := range orgs {
		orgs[i] = tenants.NewOrg{Org: tenants.OrgInput{ID: OrgID(i), Name: fmt.Sprintf("Org %d", i), PlanID: "scale"}, Teams: teams, Key: key}
	}
	keys, err := svc.ImportOrgs(ctx, a, orgs)
	if err != nil {
		return fmt.Errorf("provision: %w", err)
	}
	for i, k := range keys {
		if k.Token != Token(i) {
			return fmt.Errorf("provision: the key of %s is not Token(%d)", OrgID(i), i)
		}
	}
	return nil
}
