package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// The states of a reservation.
const (
	StateHeld      = "held"
	StateCommitted = "committed"
	StateReleased  = "released"
	StateExpired   = "expired"
)

// ReserveRequest holds Amount units of Metric for Org, Team and User until the work's
// real cost is known (POST /v1/reservations): LLM tokens, GPU seconds.
type ReserveRequest struct {
	Org    string
	Team   string
	User   string
	Metric string // "" is "requests"
	Amount int64  // the units to hold: the most the work may cost
	// Amounts holds several metrics at once, all or nothing: {"requests": 1,
	// "tokens": 4000}. It replaces Metric and Amount (setting both is a 400).
	Amounts map[string]int64
	// TTL is how long the units are held (the API's default, 60 s, when 0; 1 s to 1 h).
	TTL time.Duration
	// OnExpiry is what happens to units neither committed nor released by then:
	// "commit" (the API's default) or "release".
	OnExpiry string
	// IdempotencyKey: as a check's; "" lets the client generate one for the call.
	IdempotencyKey string
}

// Reservation is a reservation's state, as Reserve, Commit, Release and
// GetReservation answer it.
type Reservation struct {
	ID        string    `json:"id"`
	State     string    `json:"state"` // held, committed, released or expired
	Org       string    `json:"org"`
	Team      string    `json:"team"`
	User      string    `json:"user"`
	Metric    string    `json:"metric"`
	Amount    int64     `json:"amount"`
	ExpiresAt time.Time `json:"expires_at"`
	OnExpiry  string    `json:"on_expiry"`
	// Of a reservation of several metrics: each metric's figures as the API lists
	// them (Metric, Amount, Used, Released and OverReserved above are its first's),
	// and the same as maps: Amounts and the ...ByMetric maps.
	Metrics []ReservationMetric `json:"metrics"`
	Amounts map[string]int64    `json:"amounts"`
	// Once settled: the units counted, the units given back, the units used beyond
	// the amount (counted in full), and when.
	Used                 int64            `json:"-"`
	Released             int64            `json:"-"`
	OverReserved         int64            `json:"-"`
	UsedByMetric         map[string]int64 `json:"-"`
	ReleasedByMetric     map[string]int64 `json:"-"`
	OverReservedByMetric map[string]int64 `json:"-"`
	SettledAt            time.Time        `json:"settled_at"`
	// Levels: when just reserved, each level and window with a limit, as a check's.
	Levels   []Level `json:"levels"`
	Replayed bool    `json:"replayed"` // the reservation of an earlier call with this idempotency key

	// Of Reserve only. Allowed is false when the units could not be held (a 429, as
	// a denied check: nothing held), with BlockedAt and RetryAfter.
	Allowed        bool          `json:"-"`
	BlockedAt      *LevelRef     `json:"blocked_at"`
	RetryAfter     time.Duration `json:"-"`
	RateLimit      RateLimit     `json:"-"`
	IdempotencyKey string        `json:"-"`
	// Policies is the RateLimit-Policy field of the answer; ViolatedPolicies, when
	// denied, names the policy that refused (see CheckResult).
	Policies         []Policy `json:"-"`
	ViolatedPolicies []string `json:"violated-policies"`
	// NotDecided: Quotaplane did not answer and the FailPolicy decided; such a
	// reservation has no ID: there is nothing to commit or release.
	NotDecided bool  `json:"-"`
	Cause      error `json:"-"`
}

// ReservationMetric is one metric of a reservation of several.
type ReservationMetric struct {
	Metric       string `json:"metric"`
	Amount       int64  `json:"amount"`
	Used         int64  `json:"used"` // once settled, as Released and OverReserved
	Released     int64  `json:"released"`
	OverReserved int64  `json:"over_reserved"`
}

// decodeReservation reads a reservation answer, and a denial's retry_after_seconds.
// used, released and over_reserved are numbers (an object, metric -> units, is read
// too); a reservation of several metrics lists them in metrics, which fill Amounts
// and the ...ByMetric maps.
func decodeReservation(r *reply) (*Reservation, *int64, error) {
	var a struct {
		Reservation
		Used              json.RawMessage `json:"used"`
		Released          json.RawMessage `json:"released"`
		OverReserved      json.RawMessage `json:"over_reserved"`
		RetryAfterSeconds *int64          `json:"retry_after_seconds"`
	}
	if err := decode(r, &a); err != nil {
		return nil, nil, err
	}
	res := &a.Reservation
	for _, f := range []struct {
		raw   json.RawMessage
		n     *int64
		per   *map[string]int64
		field string
	}{{a.Used, &res.Used, &res.UsedByMetric, "used"}, {a.Released, &res.Released, &res.ReleasedByMetric, "released"},
		{a.OverReserved, &res.OverReserved, &res.OverReservedByMetric, "over_reserved"}} {
		if err := units(f.raw, f.n, f.per); err != nil {
			return nil, nil, fmt.Errorf("quotaplane client: decode a %d answer: %s: %w", r.status, f.field, err)
		}
	}
	if len(res.Metrics) > 0 {
		res.Amounts = make(map[string]int64, len(res.Metrics))
		settled := res.State == StateCommitted || res.State == StateReleased || res.State == StateExpired
		if settled {
			res.UsedByMetric, res.ReleasedByMetric, res.OverReservedByMetric =
				map[string]int64{}, map[string]int64{}, map[string]int64{}
		}
		for _, m := range res.Metrics {
			res.Amounts[m.Metric] = m.Amount
			if settled {
				res.UsedByMetric[m.Metric], res.ReleasedByMetric[m.Metric], res.OverReservedByMetric[m.Metric] =
					m.Used, m.Released, m.OverReserved
			}
		}
	}
	return res, a.RetryAfterSeconds, nil
}

// units reads a number into n, or an object of numbers into per and their sum into n.
func units(raw json.RawMessage, n *int64, per *map[string]int64) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	if raw[0] != '{' {
		return json.Unmarshal(raw, n)
	}
	if err := json.Unmarshal(raw, per); err != nil {
		return err
	}
	for _, v := range *per {
		*n += v
	}
	return nil
}

// Reserve holds req.Amount units against every limit of every level, as used units
// count, until Commit, Release or the TTL. A reservation over quota is a result
// with Allowed false (nothing held), not an error. Errors as Check's.
func (c *Client) Reserve(ctx context.Context, req ReserveRequest) (*Reservation, error) {
	in := struct {
		Org            string           `json:"org"`
		Team           string           `json:"team,omitempty"`
		User           string           `json:"user,omitempty"`
		Metric         string           `json:"metric,omitempty"`
		Amount         *int64           `json:"amount,omitempty"`
		Amounts        map[string]int64 `json:"amounts,omitempty"`
		TTLSeconds     int64            `json:"ttl_seconds,omitempty"`
		OnExpiry       string           `json:"on_expiry,omitempty"`
		IdempotencyKey string           `json:"idempotency_key"`
	}{Org: req.Org, Team: req.Team, User: req.User, Metric: req.Metric, Amounts: req.Amounts,
		TTLSeconds: ttlSeconds(req.TTL), OnExpiry: req.OnExpiry, IdempotencyKey: req.IdempotencyKey}
	if req.Amounts == nil || req.Amount != 0 { // with Amounts, an Amount too is the caller's 400
		in.Amount = &req.Amount
	}
	if in.IdempotencyKey == "" {
		in.IdempotencyKey = NewIdempotencyKey()
	}
	r, err := c.do(ctx, c.budget, http.MethodPost, "/v1/reservations", in)
	check := CheckRequest{Org: req.Org, Team: req.Team, User: req.User, Metric: req.Metric, Cost: req.Amount,
		Costs: req.Amounts, IdempotencyKey: in.IdempotencyKey}
	if err != nil {
		if c.policy == nil || !errors.Is(err, ErrUnavailable) {
			return nil, err
		}
		allowed := c.policy(ctx, check, err)
		c.decided(ctx, DecisionInfo{Op: "reserve", Request: check, Allowed: allowed, NotDecided: true, Cause: err})
		return &Reservation{Amount: req.Amount, Amounts: req.Amounts, Allowed: allowed, IdempotencyKey: in.IdempotencyKey,
			NotDecided: true, Cause: err}, nil
	}
	if r.status != http.StatusCreated && r.status != http.StatusOK && r.status != http.StatusTooManyRequests {
		return nil, errorOf(r)
	}
	out, retryAfter, err := decodeReservation(r)
	if err != nil {
		return nil, err
	}
	out.Allowed = r.status != http.StatusTooManyRequests
	out.IdempotencyKey = in.IdempotencyKey
	if retryAfter != nil {
		out.RetryAfter = time.Duration(*retryAfter) * time.Second
	}
	out.RateLimit = tightest(out.Levels, out.Allowed, out.BlockedAt, out.RetryAfter, time.Now())
	rl, policies, ok := headerRateLimit(r.header)
	if ok {
		out.RateLimit = rl
	}
	out.Policies = policies
	c.decided(ctx, DecisionInfo{Op: "reserve", Request: check, Allowed: out.Allowed})
	return out, nil
}

// Commit counts used units of the held reservation id and gives back the rest; used
// over the amount is counted in full (OverReserved). A repeat answers the first
// commit again, so it is retried safely. Errors: a *Error with 409 when the
// reservation was released or expired, 404 when it is unknown (or another org's).
func (c *Client) Commit(ctx context.Context, id string, used int64) (*Reservation, error) {
	return c.reservation(ctx, http.MethodPost, "/v1/reservations/"+url.PathEscape(id)+"/commit",
		struct {
			Used int64 `json:"used"`
		}{used})
}

// CommitUsed is Commit of a reservation of several metrics (Amounts): used per
// metric, a metric left out used 0. The concurrent limits get all of it back, as
// on every settlement.
func (c *Client) CommitUsed(ctx context.Context, id string, used map[string]int64) (*Reservation, error) {
	if used == nil {
		used = map[string]int64{}
	}
	return c.reservation(ctx, http.MethodPost, "/v1/reservations/"+url.PathEscape(id)+"/commit",
		struct {
			Used map[string]int64 `json:"used"`
		}{used})
}

// Extend keeps the held reservation id for ttl more from now (a heartbeat of long
// work: a stream holding a concurrency slot), rounded up to whole seconds, 1 s to
// 1 h; it answers the new ExpiresAt. Errors: a *Error with 409 naming the state
// once the reservation is settled or expired, 404 when it is unknown.
func (c *Client) Extend(ctx context.Context, id string, ttl time.Duration) (*Reservation, error) {
	return c.reservation(ctx, http.MethodPost, "/v1/reservations/"+url.PathEscape(id)+"/extend",
		struct {
			TTLSeconds int64 `json:"ttl_seconds"`
		}{max(ttlSeconds(ttl), 1)})
}

// ttlSeconds is d in whole seconds, rounded up (0 for 0: the API's default).
func ttlSeconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}

// Release gives back every unit of the held reservation id.
func (c *Client) Release(ctx context.Context, id string) (*Reservation, error) {
	return c.reservation(ctx, http.MethodDelete, "/v1/reservations/"+url.PathEscape(id), nil)
}

// GetReservation returns the state of reservation id.
func (c *Client) GetReservation(ctx context.Context, id string) (*Reservation, error) {
	return c.reservation(ctx, http.MethodGet, "/v1/reservations/"+url.PathEscape(id), nil)
}

func (c *Client) reservation(ctx context.Context, method, path string, in any) (*Reservation, error) {
	r, err := c.do(ctx, c.settleBudget, method, path, in)
	if err != nil {
		return nil, err
	}
	if r.status != http.StatusOK {
		return nil, errorOf(r)
	}
	res, _, err := decodeReservation(r)
	if err != nil {
		return nil, err
	}
	res.Allowed = true
	return res, nil
}
