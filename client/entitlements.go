package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
)

// Entitlements are an org's resolved features (GET /v1/entitlements): its plan's,
// with the operator's overrides for the org applied.
type Entitlements struct {
	Org  string
	Team string // the team asked about, or the registered user's; "" when neither
	User string
	// Features maps a feature's name to its value: a bool, an int64 or a string.
	Features map[string]any
	// Sources says where each feature comes from: "plan", or "org" (an override).
	Sources map[string]string
}

// Entitlements returns the resolved features of org for team and user (either may
// be ""; an unknown team is a 404 *Error). Quotaplane answers from its cache, with no
// database query once the org is warm; the client does not cache.
func (c *Client) Entitlements(ctx context.Context, org, team, user string) (*Entitlements, error) {
	q := url.Values{"org": {org}}
	if team != "" {
		q.Set("team", team)
	}
	if user != "" {
		q.Set("user", user)
	}
	r, err := c.do(ctx, c.budget, http.MethodGet, "/v1/entitlements?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	if r.status != http.StatusOK {
		return nil, errorOf(r)
	}
	var body struct {
		Org      string            `json:"org"`
		Team     string            `json:"team"`
		User     string            `json:"user"`
		Features map[string]any    `json:"features"`
		Sources  map[string]string `json:"sources"`
	}
	d := json.NewDecoder(bytes.NewReader(r.body))
	d.UseNumber() // integers as int64, never through a float
	if err := d.Decode(&body); err != nil {
		return nil, fmt.Errorf("quotaplane client: decode a %d answer: %w", r.status, err)
	}
	for k, v := range body.Features {
		if n, ok := v.(json.Number); ok {
			i, err := n.Int64()
			if err != nil {
				return nil, fmt.Errorf("quotaplane client: feature %q: %w", k, err)
			}
			body.Features[k] = i
		}
	}
	return &Entitlements{Org: body.Org, Team: body.Team, User: body.User, Features: body.Features, Sources: body.Sources}, nil
}

// Feature returns the value of feature for org, team and user: a bool, an int64 or
// a string, or nil when the org does not have it.
func (c *Client) Feature(ctx context.Context, org, team, user, feature string) (any, error) {
	e, err := c.Entitlements(ctx, org, team, user)
	if err != nil {
		return nil, err
	}
	return e.Features[feature], nil
}

// Entitled reports whether org (for team and user) has feature: true when the
// feature is present and not false, 0 or "" (so a boolean feature, a positive or
// negative count, a named tier).
func (c *Client) Entitled(ctx context.Context, org, team, user, feature string) (bool, error) {
	v, err := c.Feature(ctx, org, team, user, feature)
	if err != nil {
		return false, err
	}
	switch x := v.(type) {
	case bool:
		return x, nil
	case int64:
		return x != 0, nil
	case string:
		return x != "", nil
	}
	return false, nil
}
