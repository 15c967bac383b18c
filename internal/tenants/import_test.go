package tenants_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// richOrg is an org with an override, settings of its own, teams with limits and
// user defaults (each fitting after the ones before it) and a key of two scopes.
func richOrg(id string) tenants.NewOrg {
	return tenants.NewOrg{
		Org: tenants.OrgInput{ID: id, Name: "Org " + id, PlanID: "pro", Limits: []vocab.Limit{lim("requests", vocab.Month, 900)},
			Mode: vocab.Shadow, UnknownUsers: tenants.UnknownUsersRefuse, ClientLeases: tenants.LeasesOff, WebhookURL: "https://hooks.example.com/x", BillingAnchorDay: 7},
		Teams: []tenants.TeamInput{
			{ID: "eng", Name: "Engineering", Limits: []vocab.Limit{lim("requests", vocab.Month, 500), lim("requests", vocab.Minute, 50)},
				UserLimits: []vocab.Limit{lim("requests", vocab.Month, 100)}},
			{ID: "ops", Name: "Ops", Limits: []vocab.Limit{lim("requests", vocab.Month, 400)}, UnknownUsers: tenants.UnknownUsersAllow},
			{ID: "free", Name: "Free"},
		},
		Key: tenants.APIKeyInput{Name: "checks", Scopes: []tenants.Scope{tenants.ScopeCheck, tenants.ScopeAdmin}},
	}
}

// plainOrg is an org with defaults only, one team and a check key.
func plainOrg(id string) tenants.NewOrg {
	return tenants.NewOrg{Org: tenants.OrgInput{ID: id, Name: "Org " + id, PlanID: "pro"},
		Teams: []tenants.TeamInput{{ID: "t0", Name: "Team 0"}},
		Key:   tenants.APIKeyInput{Name: "k", Scopes: []tenants.Scope{tenants.ScopeCheck}}}
}

// seen is what a reader of the service sees of one org: the org, its teams, its keys
// and its audit trail, with what differs between any two orgs (ids, key ids and
// prefixes, times) blanked.
type seen struct {
	Org   tenants.Org
	Teams []tenants.Team
	Keys  []tenants.APIKey
	Trail []string // actor, action, object, request id, before, after, oldest first
}

func mustSee(t *testing.T, s *tenants.Service, orgID string) seen {
	t.Helper()
	ctx := context.Background()
	var v seen
	var err error
	if v.Org, err = s.GetOrg(ctx, orgID); err != nil {
		t.Fatal(err)
	}
	if v.Teams, _, err = s.ListTeams(ctx, orgID, tenants.Page{}); err != nil {
		t.Fatal(err)
	}
	if v.Keys, _, err = s.ListAPIKeys(ctx, orgID, tenants.Page{}); err != nil {
		t.Fatal(err)
	}
	es, _, err := s.ListAudit(ctx, orgID, tenants.Page{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	blank := strings.NewReplacer(orgID, "ORG")
	for _, k := range v.Keys {
		blank = strings.NewReplacer(orgID, "ORG", k.ID, "KEY", k.Prefix, "PREFIX")
	}
	for _, e := range slices.Backward(es) {
		v.Trail = append(v.Trail, blank.Replace(strings.Join([]string{e.Actor, e.Action, e.Object, e.RequestID,
			timeless(t, e.Before), timeless(t, e.After)}, " | ")))
	}
	v.Org.ID, v.Org.Name = "", ""
	return v
}

// timeless is a JSON snapshot without its times.
func timeless(t *testing.T, b []byte) string {
	t.Helper()
	if b == nil {
		return "null"
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if _, ok := m["created_at"]; !ok {
		t.Errorf("snapshot %s has no created_at", b)
	}
	delete(m, "created_at")
	delete(m, "updated_at")
	out, _ := json.Marshal(m)
	return string(out)
}

var ignoreDiffering = cmp.Options{
	cmpopts.IgnoreFields(tenants.Org{}, "CreatedAt", "UpdatedAt"),
	cmpopts.IgnoreFields(tenants.Team{}, "OrgID", "CreatedAt", "UpdatedAt"),
	cmpopts.IgnoreFields(tenants.APIKey{}, "ID", "OrgID", "Prefix", "CreatedAt"),
}

func TestImportOrgsEqualsTheSingleCalls(t *testing.T) {
	ctx := context.Background()
	s := MustService(t)
	for _, in := range []tenants.NewOrg{richOrg("single"), plainOrg("single-plain")} {
		if _, err := s.CreateOrg(ctx, op, in.Org); err != nil {
			t.Fatal(err)
		}
		for _, tm := range in.Teams {
			if _, err := s.CreateTeam(ctx, op, in.Org.ID, tm); err != nil {
				t.Fatal(err)
			}
		}
		if _, _, err := s.CreateAPIKey(ctx, op, in.Org.ID, in.Key); err != nil {
			t.Fatal(err)
		}
	}

	var changed []string
	s.OnChange(func(ids ...string) { changed = append(changed, ids...) })
	orgs := []tenants.NewOrg{richOrg("imported"), plainOrg("imported-plain")}
	keys, err := s.ImportOrgs(ctx, op, orgs)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"imported", "imported-plain"}, changed); diff != "" {
		t.Errorf("orgs reported changed (-want +got):\n%s", diff)
	}
	if len(keys) != len(orgs) {
		t.Fatalf("%d keys for %d orgs", len(keys), len(orgs))
	}
	for i, pair := range [][2]string{{"single", "imported"}, {"single-plain", "imported-plain"}} {
		want, got := mustSee(t, s, pair[0]), mustSee(t, s, pair[1])
		if diff := cmp.Diff(want, got, ignoreDiffering); diff != "" {
			t.Errorf("%s as a reader sees it, against %s made by the single calls (-single +imported):\n%s", pair[1], pair[0], diff)
		}
		// The key returned is the key stored, and its token authenticates as it.
		k := keys[i]
		if diff := cmp.Diff(got.Keys, []tenants.APIKey{k.Key}, cmpopts.EquateApproxTime(0)); diff != "" {
			t.Errorf("key returned against key listed (-listed +returned):\n%s", diff)
		}
		authed, err := s.Authenticate(ctx, k.Token)
		if err != nil {
			t.Fatalf("the token of %s: %v", pair[1], err)
		}
		if authed.OrgID != pair[1] || authed.ID != k.Key.ID || !slices.Equal(authed.Scopes, orgs[i].Key.Scopes) {
			t.Errorf("the token authenticates as %+v, want key %s of %s with scopes %v", authed, k.Key.ID, pair[1], orgs[i].Key.Scopes)
		}
		if !strings.HasPrefix(k.Token, k.Key.Prefix) || len(k.Key.Prefix) != 12 {
			t.Errorf("prefix %q is not the start of the token %q", k.Key.Prefix, k.Token)
		}
	}
}

// TestImportOrgsRefusesBadInput: each bad input is refused with the kind the single
// call refuses it with, naming the element, and nothing of the import is written.
func TestImportOrgsRefusesBadInput(t *testing.T) {
	ctx := context.Background()
	s := MustService(t)
	with := func(i int, change func(*tenants.NewOrg)) []tenants.NewOrg {
		orgs := []tenants.NewOrg{richOrg("a"), richOrg("b"), plainOrg("c")}
		change(&orgs[i])
		return orgs
	}
	cases := []struct {
		name      string
		orgs      []tenants.NewOrg
		want      error
		wantField string
	}{
		{"invalid org id", with(1, func(o *tenants.NewOrg) { o.Org.ID = "no spaces" }), tenants.ErrInvalid, "orgs[1].id"},
		{"invalid team", with(2, func(o *tenants.NewOrg) { o.Teams[0].Name = "" }), tenants.ErrInvalid, "orgs[2].teams[0].name"},
		{"invalid key", with(0, func(o *tenants.NewOrg) { o.Key.Scopes = nil }), tenants.ErrInvalid, "orgs[0].key.scopes"},
		{"an org id twice", with(2, func(o *tenants.NewOrg) { o.Org.ID = "a" }), tenants.ErrExists, ""},
		{"a team id twice in an org", with(1, func(o *tenants.NewOrg) { o.Teams[2].ID = "eng" }), tenants.ErrExists, ""},
		{"an org that exists", with(2, func(o *tenants.NewOrg) { o.Org.ID = "acme" }), tenants.ErrExists, ""},
		{"no such plan", with(1, func(o *tenants.NewOrg) { o.Org.PlanID = "gold" }), tenants.ErrInvalid, "orgs[1].plan"},
		{"teams over the org", with(1, func(o *tenants.NewOrg) { o.Teams[1].Limits[0].Limit = 401 }), tenants.ErrOverAllocated,
			"orgs[1].teams[1].limits[0].limit"},
		{"a team's unknown metric", with(0, func(o *tenants.NewOrg) { o.Teams[2].Limits = []vocab.Limit{lim("tokens", vocab.Month, 1)} }),
			tenants.ErrOverAllocated, "orgs[0].teams[2].limits[0].metric"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := auditCount(t, s)
			keys, err := s.ImportOrgs(ctx, op, tc.orgs)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if fs := derrors.FieldsOf(err); tc.wantField != "" && (len(fs) == 0 || fs[0].Field != tc.wantField) {
				t.Errorf("fields %+v, want the first at %q (err %v)", fs, tc.wantField, err)
			}
			if len(keys) != 0 {
				t.Errorf("%d keys returned", len(keys))
			}
			mustHoldOnly(t, s, "acme")
			if after := auditCount(t, s); after != before {
				t.Errorf("refused import wrote %d audit rows of acme", after-before)
			}
		})
	}
}

// mustHoldOnly fails unless the orgs are exactly ids.
func mustHoldOnly(t *testing.T, s *tenants.Service, ids ...string) {
	t.Helper()
	var got []string
	for page := (tenants.Page{Limit: 1000}); ; {
		orgs, next, err := s.ListOrgs(context.Background(), page)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range orgs {
			got = append(got, o.ID)
		}
		if next == "" {
			break
		}
		page.Cursor = next
	}
	if len(got) != len(ids) || !slices.Equal(got, ids) {
		t.Errorf("orgs: %d, want %d (%.5v...)", len(got), len(ids), got)
	}
}

// TestImportOrgsRollsBackTheFailingChunk: a chunk whose key cannot be written (its id
// is taken) leaves nothing of its orgs and teams, which were copied before it; the
// chunk before it stays, and its keys are returned.
func TestImportOrgsRollsBackTheFailingChunk(t *testing.T) {
	ctx := context.Background()
	taken := [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	keyOf := func(orgID string) (id [8]byte, secret [32]byte, err error) {
		if orgID == "acme" || orgID == "late" {
			id = taken
		} else {
			_, _ = rand.Read(id[:])
		}
		_, _ = rand.Read(secret[:])
		return id, secret, nil
	}
	s := MustService(t, tenants.WithKeyTokens(keyOf))
	// CreateAPIKey takes its tokens from the same source.
	k, token, err := s.CreateAPIKey(ctx, op, "acme", tenants.APIKeyInput{Name: "k", Scopes: []tenants.Scope{tenants.ScopeCheck}})
	if err != nil {
		t.Fatal(err)
	}
	if k.ID != "ffffffffffffffff" {
		t.Fatalf("key id %s, want the source's", k.ID)
	}
	if _, err := s.Authenticate(ctx, token); err != nil {
		t.Fatalf("token from the source: %v", err)
	}

	var orgs []tenants.NewOrg
	want := []string{"acme"}
	for i := range tenants.ImportChunk + 3 {
		id := fmt.Sprintf("o%05d", i)
		if i == tenants.ImportChunk+1 {
			id = "late"
		}
		orgs = append(orgs, plainOrg(id))
		if i < tenants.ImportChunk {
			want = append(want, id)
		}
	}
	keys, err := s.ImportOrgs(ctx, op, orgs)
	if !errors.Is(err, tenants.ErrExists) {
		t.Fatalf("err = %v, want ErrExists", err)
	}
	if len(keys) != tenants.ImportChunk {
		t.Errorf("%d keys returned, want the first chunk's %d", len(keys), tenants.ImportChunk)
	}
	slices.Sort(want)
	mustHoldOnly(t, s, want...)
	for _, id := range []string{fmt.Sprintf("o%05d", tenants.ImportChunk), "late"} {
		if _, _, err := s.ListTeams(ctx, id, tenants.Page{}); !errors.Is(err, tenants.ErrNotFound) {
			t.Errorf("teams of %s: err = %v, want ErrNotFound", id, err)
		}
	}
	if _, err := s.Authenticate(ctx, keys[len(keys)-1].Token); err != nil {
		t.Errorf("the first chunk's last key: %v", err)
	}
}

// TestImportOrgsHoldsItsPlan: a plan lowered while an import waits to write is the
// plan its rules are checked against. The plan is locked here as UpdatePlan locks it,
// the import (checked against the plan as it was) waits for the lock, the plan is
// lowered under its teams and committed: the import must then refuse them.
func TestImportOrgsHoldsItsPlan(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	s := tenants.NewService(pool)
	if _, err := s.CreatePlan(ctx, op, tenants.PlanInput{ID: "pro", Name: "Pro", FailMode: vocab.FailOpen,
		Limits: []vocab.Limit{lim("requests", vocab.Month, 1000)}}); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM plans WHERE id = 'pro' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	in := plainOrg("late")
	in.Teams[0].Limits = []vocab.Limit{lim("requests", vocab.Month, 800)}
	done := make(chan error, 1)
	go func() {
		_, err := s.ImportOrgs(ctx, op, []tenants.NewOrg{in})
		done <- err
	}()
	for waiting := 0; waiting == 0; {
		select {
		case err := <-done:
			t.Fatalf("the import ended (%v) without waiting for the plan's lock", err)
		case <-time.After(10 * time.Millisecond):
		}
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tx.Exec(ctx, `UPDATE plan_limits SET max_units = 700 WHERE plan_id = 'pro'`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, tenants.ErrOverAllocated) {
		t.Fatalf("err = %v, want ErrOverAllocated against the lowered plan", err)
	}
	if _, err := s.GetOrg(ctx, "late"); !errors.Is(err, tenants.ErrNotFound) {
		t.Errorf("GetOrg after the refused import: %v, want ErrNotFound", err)
	}
}
