package client

import (
	"context"
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
	// Once settled: the units counted, the units given back, the units used beyond
	// the amount (counted in full), and when.
	Used         int64     `json:"used"`
	Released     int64     `json:"released"`
	OverReserved int64     `json:"over_reserved"`
	SettledAt    time.Time `json:"settled_at"`
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
	// NotDecided: Quotaplane did not answer and the FailPolicy decided; such a
	// reservation has no ID: there is nothing to commit or release.
	NotDecided bool  `json:"-"`
	Cause      error `json:"-"`
}

// decodeReservation reads a reservation answer, and a denial's retry_after_seconds.
func decodeReservation(r *reply) (*Reservation, *int64, error) {
	var a struct {
		Reservation
		RetryAfterSeconds *int64 `json:"retry_after_seconds"`
	}
	if err := decode(r, &a); err != nil {
		return nil, nil, err
	}
	return &a.Reservation, a.RetryAfterSeconds, nil
}

// Reserve holds req.Amount units against every limit of every level, as used units
// count, until Commit, Release or the TTL. A reservation over quota is a result
// with Allowed false (nothing held), not an error. Errors as Check's.
func (c *Client) Reserve(ctx context.Context, req ReserveRequest) (*Reservation, error) {
	in := struct {
		Org            string `json:"org"`
		Team           string `json:"team,omitempty"`
		User           string `json:"user,omitempty"`
		Metric         string `json:"metric,omitempty"`
		Amount         int64  `json:"amount"`
		TTLSeconds     int64  `json:"ttl_seconds,omitempty"`
		OnExpiry       string `json:"on_expiry,omitempty"`
		IdempotencyKey string `json:"idempotency_key"`
	}{Org: req.Org, Team: req.Team, User: req.User, Metric: req.Metric, Amount: req.Amount,
		TTLSeconds: int64(req.TTL.Round(time.Second) / time.Second), OnExpiry: req.OnExpiry, IdempotencyKey: req.IdempotencyKey}
	if in.IdempotencyKey == "" {
		in.IdempotencyKey = NewIdempotencyKey()
	}
	r, err := c.do(ctx, http.MethodPost, "/v1/reservations", in)
	if err != nil {
		if c.policy == nil {
			return nil, err
		}
		check := CheckRequest{Org: req.Org, Team: req.Team, User: req.User, Metric: req.Metric, Cost: req.Amount,
			IdempotencyKey: in.IdempotencyKey}
		return &Reservation{Amount: req.Amount, Allowed: c.policy(ctx, check, err), IdempotencyKey: in.IdempotencyKey,
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
	if rl, ok := headerRateLimit(r.header); ok {
		out.RateLimit = rl
	}
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

// Release gives back every unit of the held reservation id.
func (c *Client) Release(ctx context.Context, id string) (*Reservation, error) {
	return c.reservation(ctx, http.MethodDelete, "/v1/reservations/"+url.PathEscape(id), nil)
}

// GetReservation returns the state of reservation id.
func (c *Client) GetReservation(ctx context.Context, id string) (*Reservation, error) {
	return c.reservation(ctx, http.MethodGet, "/v1/reservations/"+url.PathEscape(id), nil)
}

func (c *Client) reservation(ctx context.Context, method, path string, in any) (*Reservation, error) {
	r, err := c.do(ctx, method, path, in)
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
