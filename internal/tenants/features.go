package tenants

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"sort"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// Entitlements: a plan's features, an org's overrides of them, and the features they
// resolve to, which the check path serves from the resolved org
// (ResolvedOrg.Entitlements) and so from the cache, with no query per call.

// Features maps a feature's name to its value: a bool, an int64 or a string. In an
// org's overrides a nil value removes the plan's feature for that org.
type Features map[string]any

// The bounds of a features object (a plan's, or an org's overrides): a plan's may
// not grow without bound, since every resolved org of the plan carries it in memory.
const (
	MaxFeatures         = 64
	MaxFeatureStringLen = 256 // bytes of a string value
	// MaxFeatureInt bounds an integer value (and -MaxFeatureInt): 2^53-1, the largest
	// integer a JavaScript number (the TypeScript SDK's, the console's) holds exactly.
	MaxFeatureInt = 1<<53 - 1
)

// FeatureNamePattern is what a feature's name must match.
const FeatureNamePattern = `^[a-zA-Z][a-zA-Z0-9_.:-]{0,63}$`

var featureName = regexp.MustCompile(FeatureNamePattern)

// FeatureSource says where a resolved feature's value comes from.
type FeatureSource string

// The sources of a resolved feature.
const (
	SourcePlan FeatureSource = "plan"
	SourceOrg  FeatureSource = "org" // the org's override
)

// Entitlements are an org's resolved features and where each comes from.
type Entitlements struct {
	Features Features                 `json:"features"`
	Sources  map[string]FeatureSource `json:"sources"`
}

// ResolveFeatures applies an org's overrides to its plan's features: an override
// sets a feature (whatever the plan says, or adds one the plan lacks), and a nil
// override removes the plan's. Neither argument is changed.
func ResolveFeatures(plan, overrides Features) Entitlements {
	e := Entitlements{Features: make(Features, len(plan)+len(overrides)), Sources: make(map[string]FeatureSource, len(plan)+len(overrides))}
	for k, v := range plan {
		e.Features[k], e.Sources[k] = v, SourcePlan
	}
	for k, v := range overrides {
		if v == nil {
			delete(e.Features, k)
			delete(e.Sources, k)
			continue
		}
		e.Features[k], e.Sources[k] = v, SourceOrg
	}
	return e
}

// featureValue is v as a feature's value (bool, int64 or string), as JSON decoding
// into any gives it (float64, json.Number) or Go code does (int, int64), and whether
// it is one; nil is one only where nilOK (an override's removal).
func featureValue(v any, nilOK bool) (any, string) {
	const kinds = "must be a boolean, an integer or a string"
	intMsg := fmt.Sprintf("an integer must be between -%d and %d", MaxFeatureInt, MaxFeatureInt)
	switch x := v.(type) {
	case nil:
		if nilOK {
			return nil, ""
		}
		return nil, kinds + " (null removes a feature only in an org's overrides)"
	case bool:
		return x, ""
	case string:
		if len(x) > MaxFeatureStringLen || !utf8.ValidString(x) {
			return nil, fmt.Sprintf("a string must be valid UTF-8 of at most %d bytes", MaxFeatureStringLen)
		}
		return x, ""
	case int:
		return featureValue(int64(x), nilOK)
	case int64:
		if x < -MaxFeatureInt || x > MaxFeatureInt {
			return nil, intMsg
		}
		return x, ""
	case float64:
		if x != math.Trunc(x) || math.IsInf(x, 0) {
			return nil, kinds
		}
		if x < -MaxFeatureInt || x > MaxFeatureInt {
			return nil, intMsg
		}
		return int64(x), ""
	case json.Number:
		n, err := x.Int64()
		if err != nil {
			f, ferr := x.Float64()
			if ferr != nil {
				return nil, kinds
			}
			return featureValue(f, nilOK)
		}
		return featureValue(n, nilOK)
	}
	return nil, kinds
}

// validateFeatures records every problem of fs under field (e.g. "features" ->
// "features.seats") and normalizes its values in place (integers to int64). nilOK
// admits nil values: an org's overrides, where null removes a feature.
func validateFeatures(errs *fieldErrs, field string, fs Features, nilOK bool) {
	if len(fs) > MaxFeatures {
		errs.add(field, "must have at most %d features, not %d", MaxFeatures, len(fs))
		return
	}
	names := make([]string, 0, len(fs))
	for k := range fs {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if !featureName.MatchString(k) {
			errs.add(field, "feature name %q must be 1 to 64 characters: letters a-z and A-Z, digits and _ . : -, the first a letter", k)
			continue
		}
		v, msg := featureValue(fs[k], nilOK)
		if msg != "" {
			errs.add(field+"."+k, "%s", msg)
			continue
		}
		fs[k] = v
	}
}

// ValidateFeatures reports every problem of a plan's features (nilOK false) or of an
// org's overrides (nilOK true), as a *ValidationError naming the field (features, or
// features.<name>), and normalizes the values of fs in place.
func ValidateFeatures(fs Features, nilOK bool) error {
	var errs fieldErrs
	validateFeatures(&errs, "features", fs, nilOK)
	return errs.err()
}

// decodeFeatures reads a features object as Postgres stores it (jsonb), integers as
// int64. nil or empty is an empty object.
func decodeFeatures(raw []byte) (Features, error) {
	fs := Features{}
	if len(raw) == 0 {
		return fs, nil
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	if err := d.Decode(&fs); err != nil {
		return nil, fmt.Errorf("decode features: %w", err)
	}
	for k, v := range fs {
		if n, ok := v.(json.Number); ok {
			i, err := n.Int64()
			if err != nil {
				return nil, fmt.Errorf("decode feature %q: %w", k, err)
			}
			fs[k] = i
		}
	}
	return fs, nil
}

func encodeFeatures(fs Features) ([]byte, error) {
	if fs == nil {
		fs = Features{}
	}
	return json.Marshal(fs)
}

// OrgFeatures is an org's features as its routes show them: its plan's, its own
// overrides and what they resolve to.
type OrgFeatures struct {
	Org          string   `json:"org"`
	Plan         string   `json:"plan"`
	PlanFeatures Features `json:"plan_features"`
	Overrides    Features `json:"overrides"` // a nil value removes the plan's feature
	Entitlements
}

func getOrgFeatures(ctx context.Context, q querier, orgID string, forUpdate bool) (OrgFeatures, error) {
	sql := `SELECT o.plan_id, p.features, o.feature_overrides FROM orgs o JOIN plans p ON p.id = o.plan_id WHERE o.id = $1`
	if forUpdate {
		sql += ` FOR UPDATE OF o`
	}
	out := OrgFeatures{Org: orgID}
	var plan, over []byte
	if err := q.QueryRow(ctx, sql, orgID).Scan(&out.Plan, &plan, &over); err != nil {
		return OrgFeatures{}, translate(err, fmt.Sprintf("org %q", orgID))
	}
	var err error
	if out.PlanFeatures, err = decodeFeatures(plan); err != nil {
		return OrgFeatures{}, err
	}
	if out.Overrides, err = decodeFeatures(over); err != nil {
		return OrgFeatures{}, err
	}
	out.Entitlements = ResolveFeatures(out.PlanFeatures, out.Overrides)
	return out, nil
}

// OrgFeatures returns an org's plan features, overrides and resolved features, read
// from Postgres (the check path's GET /v1/entitlements reads the cache instead).
// Errors: ErrNotFound.
func (s *Service) OrgFeatures(ctx context.Context, orgID string) (OrgFeatures, error) {
	return getOrgFeatures(ctx, s.pool, orgID, false)
}

// SetOrgFeatures replaces an org's overrides of its plan's features (the operator's:
// the HTTP layer lets no one else call it), audited as "org.features", and drops the
// org from every replica's cache. Errors: *ValidationError, ErrNotFound.
func (s *Service) SetOrgFeatures(ctx context.Context, a Actor, orgID string, overrides Features) (OrgFeatures, error) {
	if overrides == nil {
		overrides = Features{}
	}
	if err := ValidateFeatures(overrides, true); err != nil {
		return OrgFeatures{}, err
	}
	raw, err := encodeFeatures(overrides)
	if err != nil {
		return OrgFeatures{}, err
	}
	var out OrgFeatures
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		before, err := getOrgFeatures(ctx, tx, orgID, true)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE orgs SET feature_overrides = $2, updated_at = now() WHERE id = $1`, orgID, raw); err != nil {
			return fmt.Errorf("set features of org %q: %w", orgID, err)
		}
		if out, err = getOrgFeatures(ctx, tx, orgID, false); err != nil {
			return err
		}
		return audit(ctx, tx, a, orgID, "org.features", "org:"+orgID,
			map[string]Features{"overrides": before.Overrides}, map[string]Features{"overrides": out.Overrides})
	})
	if err == nil {
		s.changed(orgID)
	}
	return out, err
}

// planFeatures loads the features of the plans given (fillPlans's part for them).
func planFeatures(ctx context.Context, q querier, plans []Plan) error {
	ids := make([]string, len(plans))
	for i, p := range plans {
		ids[i] = p.ID
	}
	rows, err := q.Query(ctx, `SELECT id, features FROM plans WHERE id = ANY($1)`, ids)
	if err != nil {
		return err
	}
	byID := map[string]Features{}
	var id string
	var raw []byte
	if _, err := pgx.ForEachRow(rows, []any{&id, &raw}, func() error {
		fs, err := decodeFeatures(raw)
		byID[id] = fs
		return err
	}); err != nil {
		return err
	}
	for i := range plans {
		if plans[i].Features = byID[plans[i].ID]; plans[i].Features == nil {
			plans[i].Features = Features{}
		}
	}
	return nil
}

// writePlanFeatures stores a plan's features (writePlanDetails's part for them).
func writePlanFeatures(ctx context.Context, tx pgx.Tx, id string, fs Features) error {
	raw, err := encodeFeatures(fs)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `UPDATE plans SET features = $2 WHERE id = $1`, id, raw)
	return err
}

// resolvedFeatures fills r.Entitlements from resolveOrgSQL's features column: a JSON
// object {"plan": the plan's features, "org": the org's overrides}.
func resolvedFeatures(r *ResolvedOrg, raw []byte) error {
	var both struct {
		Plan json.RawMessage `json:"plan"`
		Org  json.RawMessage `json:"org"`
	}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &both); err != nil {
			return err
		}
	}
	plan, err := decodeFeatures(both.Plan)
	if err != nil {
		return err
	}
	over, err := decodeFeatures(both.Org)
	if err != nil {
		return err
	}
	r.Entitlements = ResolveFeatures(plan, over)
	return nil
}
