package quotaplanetest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/quotaplane/quotaplane/client"
)

// Key is the API key Server accepts unless its Key is changed; any other answers 401.
const Key = "qpk_quotaplanetest"

// Call is a check, an item of a batch, or a reservation, as Server's Decide sees it.
type Call struct {
	Org, Team, User, Metric string
	Cost                    int64 // a reservation's amount
	Reservation             bool
	IdempotencyKey          string
}

// Verdict is how Server answers a Call. The zero Verdict allows it.
type Verdict struct {
	Deny       bool          // 429, blocked at the user's minute (the org's without a user)
	RetryAfter time.Duration // of a denial, or of a Status 503 (Retry-After)
	// Limit and Remaining are the user's minute, in the levels and the RateLimit
	// fields (100 and 99 when both are 0).
	Limit, Remaining int64
	Warning          string // warn mode: the answer's mode is warn, with this warning
	// Status answers a problem document with this status instead of a decision:
	// 400, 403, 422 (the API refused the call), 503 (no decision).
	Status int
	Detail string
	Hang   bool // never answer, until Close
}

// Request is one request Server received.
type Request struct {
	Method, Path string
	Header       http.Header
	Body         string
}

// Server is a fake Quotaplane API. Create it with NewServer and Close it.
type Server struct {
	URL string
	Key string // the accepted API key (Key)

	srv    *httptest.Server
	stop   chan struct{}
	mu     sync.Mutex
	decide func(Call) Verdict
	reqs   []Request
	res    map[string]*client.Reservation
	next   int
}

// NewServer starts a fake Quotaplane API that allows everything until Decide says
// otherwise.
func NewServer() *Server {
	s := &Server{Key: Key, stop: make(chan struct{}), res: map[string]*client.Reservation{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	s.URL = s.srv.URL
	return s
}

// Close stops the server, and lets go the requests it hangs.
func (s *Server) Close() {
	close(s.stop)
	s.srv.Close()
}

// Client is a client of the server with its key, and opts.
func (s *Server) Client(opts ...client.Option) *client.Client {
	c, err := client.New(s.URL, s.Key, opts...)
	if err != nil {
		panic(err) // the URL is httptest's
	}
	return c
}

// Decide sets how every later check, batch item and reservation is answered.
func (s *Server) Decide(f func(Call) Verdict) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.decide = f
}

// Requests are the requests the server received, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.reqs...)
}

// Reservation is reservation id as the server holds it: its State, Amount, and once
// committed, Used.
func (s *Server) Reservation(id string) (client.Reservation, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.res[id]
	if !ok {
		return client.Reservation{}, false
	}
	return *r, true
}

type callBody struct {
	Org            string           `json:"org"`
	Team           string           `json:"team"`
	User           string           `json:"user"`
	Metric         string           `json:"metric"`
	Cost           *int64           `json:"cost"`
	Costs          map[string]int64 `json:"costs"`
	Amount         *int64           `json:"amount"`
	Amounts        map[string]int64 `json:"amounts"`
	TTLSeconds     int64            `json:"ttl_seconds"`
	OnExpiry       string           `json:"on_expiry"`
	IdempotencyKey string           `json:"idempotency_key"`
}

func (b callBody) call(reservation bool) Call {
	c := Call{Org: b.Org, Team: b.Team, User: b.User, Metric: b.Metric, Reservation: reservation, IdempotencyKey: b.IdempotencyKey, Cost: 1}
	if c.Metric == "" {
		c.Metric = "requests"
	}
	switch {
	case b.Cost != nil:
		c.Cost = *b.Cost
	case b.Amount != nil:
		c.Cost = *b.Amount
	}
	for _, n := range b.Costs {
		c.Cost += n
	}
	for _, n := range b.Amounts {
		c.Cost += n
	}
	return c
}

func (s *Server) verdict(c Call) Verdict {
	s.mu.Lock()
	f := s.decide
	s.mu.Unlock()
	if f == nil {
		return Verdict{}
	}
	return f(c)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	if w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", "application/json")
	}
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func problem(status int, detail string) map[string]any {
	return map[string]any{"type": "https://quotaplane.dev/problems/" + strings.ToLower(strings.ReplaceAll(http.StatusText(status), " ", "-")),
		"title": http.StatusText(status), "status": status, "detail": detail}
}

func writeProblem(w http.ResponseWriter, status int, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	writeJSON(w, status, problem(status, detail))
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.reqs = append(s.reqs, Request{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Body: string(b)})
	key := s.Key
	s.mu.Unlock()
	if r.Header.Get("Authorization") != "Bearer "+key {
		writeProblem(w, 401, "invalid API key")
		return
	}
	var in callBody
	if len(b) > 0 && json.Unmarshal(b, &in) != nil {
		writeProblem(w, 400, "the body is not valid JSON")
		return
	}
	path := strings.TrimPrefix(r.URL.Path, "/v1/")
	switch {
	case r.Method == "POST" && path == "check":
		s.check(w, r, in)
	case r.Method == "POST" && path == "check/batch":
		s.batch(w, r, b)
	case r.Method == "POST" && path == "reservations":
		s.reserve(w, r, in)
	case strings.HasPrefix(path, "reservations/"):
		s.reservation(w, r, strings.TrimPrefix(path, "reservations/"), b)
	default:
		writeProblem(w, 404, "no such operation in quotaplanetest.Server")
	}
}

// answer is a check's answer body and status for v, and its headers set on h.
func answer(c Call, v Verdict, h http.Header) (int, map[string]any) {
	limit, remaining := v.Limit, v.Remaining
	if limit == 0 && remaining == 0 {
		limit, remaining = 100, 99
	}
	level, id := "user", c.User
	if id == "" {
		level, id = "org", c.Org
	}
	reset := time.Now().Add(time.Minute).UTC().Truncate(time.Second)
	body := map[string]any{"allowed": !v.Deny, "mode": "enforce", "levels": []any{map[string]any{"level": level, "id": id,
		"window": "minute", "limit": limit, "used": limit - remaining, "remaining": remaining, "reset_at": reset}}}
	policy := level + "-minute"
	h.Set("RateLimit-Policy", fmt.Sprintf("%q;q=%d;w=60", policy, limit))
	resetSecs := int64(60)
	status := 200
	if v.Deny {
		secs := max(int64((v.RetryAfter+time.Second-1)/time.Second), 1)
		resetSecs = secs
		body["blocked_at"] = map[string]any{"level": level, "id": id, "window": "minute"}
		body["retry_after_seconds"] = secs
		body["violated-policies"] = []string{policy}
		h.Set("Retry-After", strconv.FormatInt(secs, 10))
		status = 429
	}
	if v.Warning != "" {
		body["mode"], body["warning"] = "warn", v.Warning
		h.Set("Quotaplane-Warning", v.Warning)
	}
	h.Set("RateLimit-Limit", strconv.FormatInt(limit, 10))
	h.Set("RateLimit-Remaining", strconv.FormatInt(remaining, 10))
	h.Set("RateLimit-Reset", strconv.FormatInt(resetSecs, 10))
	h.Set("RateLimit", fmt.Sprintf("%q;r=%d;t=%d", policy, remaining, resetSecs))
	return status, body
}

// refused answers v's Status or Hang, and reports whether it did.
func (s *Server) refused(w http.ResponseWriter, r *http.Request, v Verdict) bool {
	switch {
	case v.Hang:
		select {
		case <-s.stop:
		case <-r.Context().Done():
		}
		return true
	case v.Status != 0:
		if v.RetryAfter > 0 {
			w.Header().Set("Retry-After", strconv.FormatInt(int64((v.RetryAfter+time.Second-1)/time.Second), 10))
		}
		writeProblem(w, v.Status, v.Detail)
		return true
	}
	return false
}

func (s *Server) check(w http.ResponseWriter, r *http.Request, in callBody) {
	c := in.call(false)
	v := s.verdict(c)
	if s.refused(w, r, v) {
		return
	}
	status, body := answer(c, v, w.Header())
	writeJSON(w, status, body)
}

func (s *Server) batch(w http.ResponseWriter, r *http.Request, b []byte) {
	var in struct {
		Checks []callBody `json:"checks"`
	}
	if err := json.Unmarshal(b, &in); err != nil || len(in.Checks) == 0 {
		writeProblem(w, 400, "checks: must be a list of 1 to 100 checks")
		return
	}
	results := make([]any, len(in.Checks))
	for i, cb := range in.Checks {
		c := cb.call(false)
		v := s.verdict(c)
		if v.Hang {
			s.refused(w, r, v)
			return
		}
		if v.Status != 0 {
			results[i] = problem(v.Status, v.Detail)
			continue
		}
		_, results[i] = answer(c, v, http.Header{})
	}
	writeJSON(w, 200, map[string]any{"results": results})
}

func (s *Server) reserve(w http.ResponseWriter, r *http.Request, in callBody) {
	c := in.call(true)
	v := s.verdict(c)
	if s.refused(w, r, v) {
		return
	}
	status, body := answer(c, v, w.Header())
	if status == 429 {
		writeJSON(w, 429, body)
		return
	}
	ttl := time.Duration(in.TTLSeconds) * time.Second
	if ttl == 0 {
		ttl = time.Minute
	}
	onExpiry := in.OnExpiry
	if onExpiry == "" {
		onExpiry = "commit"
	}
	s.mu.Lock()
	s.next++
	res := &client.Reservation{ID: fmt.Sprintf("r_%d", s.next), State: client.StateHeld, Org: c.Org, Team: c.Team, User: c.User,
		Metric: c.Metric, Amount: c.Cost, Amounts: in.Amounts, ExpiresAt: time.Now().Add(ttl).UTC().Truncate(time.Second), OnExpiry: onExpiry}
	s.res[res.ID] = res
	s.mu.Unlock()
	body["id"], body["state"], body["amount"], body["expires_at"], body["on_expiry"] = res.ID, res.State, res.Amount, res.ExpiresAt, onExpiry
	writeJSON(w, 201, body)
}

func (s *Server) reservation(w http.ResponseWriter, r *http.Request, rest string, b []byte) {
	id, op, _ := strings.Cut(rest, "/")
	s.mu.Lock()
	defer s.mu.Unlock()
	res, ok := s.res[id]
	if !ok {
		writeProblem(w, 404, fmt.Sprintf("reservation %s not found", id))
		return
	}
	held := res.State == client.StateHeld
	switch {
	case r.Method == "GET" && op == "":
	case r.Method == "DELETE" && op == "" && held:
		res.State, res.Released, res.SettledAt = client.StateReleased, res.Amount, time.Now().UTC()
	case r.Method == "POST" && op == "commit" && held:
		var in struct {
			Used json.RawMessage `json:"used"`
		}
		_ = json.Unmarshal(b, &in)
		var per map[string]int64
		if err := json.Unmarshal(in.Used, &res.Used); err != nil && json.Unmarshal(in.Used, &per) == nil {
			res.UsedByMetric = per
			for _, n := range per {
				res.Used += n
			}
		}
		res.State, res.Released, res.SettledAt = client.StateCommitted, max(res.Amount-res.Used, 0), time.Now().UTC()
	case r.Method == "POST" && op == "extend" && held:
		var in struct {
			TTLSeconds int64 `json:"ttl_seconds"`
		}
		_ = json.Unmarshal(b, &in)
		res.ExpiresAt = time.Now().Add(time.Duration(in.TTLSeconds) * time.Second).UTC().Truncate(time.Second)
	case !held:
		writeProblem(w, 409, fmt.Sprintf("reservation %s is %s", id, res.State))
		return
	default:
		writeProblem(w, 404, "no such operation in quotaplanetest.Server")
		return
	}
	out := map[string]any{"id": res.ID, "state": res.State, "org": res.Org, "team": res.Team, "user": res.User, "metric": res.Metric,
		"amount": res.Amount, "expires_at": res.ExpiresAt, "on_expiry": res.OnExpiry}
	if res.State != client.StateHeld {
		out["used"], out["released"], out["settled_at"] = res.Used, res.Released, res.SettledAt
	}
	writeJSON(w, 200, out)
}
