package alerttest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"
)

// ScaleRules returns the rules file src with every duration of its evaluation divided
// by factor: each group's interval, each rule's for: and keep_firing_for:, and the
// range (and step) of every range selector and subquery of every expression. Nothing
// else changes: thresholds, labels, and numbers that are not selectors (the 3600 of
// QuotaplanePeriodCloseLate's `time() - 3600`) are kept. An alert whose for: is 2m
// fires after 8 s under factor 15, its rate over [1m] reads the last 4 s: scraped
// every second instead of every 15 s, the rules see as many samples per window as in
// production.
func ScaleRules(src []byte, factor int) ([]byte, error) {
	if factor < 1 {
		return nil, fmt.Errorf("scale factor %d", factor)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(src, &doc); err != nil {
		return nil, err
	}
	groups, _ := doc["groups"].([]any)
	if len(groups) == 0 {
		return nil, fmt.Errorf("no rule groups")
	}
	scale := func(m map[string]any, key string) error {
		s, ok := m[key].(string)
		if !ok {
			return nil
		}
		d, err := model.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("%s %q: %w", key, s, err)
		}
		m[key] = model.Duration(time.Duration(d) / time.Duration(factor)).String()
		return nil
	}
	for _, g := range groups {
		gm, _ := g.(map[string]any)
		if err := scale(gm, "interval"); err != nil {
			return nil, err
		}
		rules, _ := gm["rules"].([]any)
		for _, r := range rules {
			rm, _ := r.(map[string]any)
			for _, k := range []string{"for", "keep_firing_for"} {
				if err := scale(rm, k); err != nil {
					return nil, err
				}
			}
			src, _ := rm["expr"].(string)
			expr, err := parser.ParseExpr(src)
			if err != nil {
				return nil, fmt.Errorf("expr %q: %w", src, err)
			}
			parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
				switch n := n.(type) {
				case *parser.MatrixSelector:
					n.Range /= time.Duration(factor)
				case *parser.SubqueryExpr:
					n.Range /= time.Duration(factor)
					n.Step /= time.Duration(factor)
				}
				return nil
			})
			rm["expr"] = expr.String()
		}
	}
	return yaml.Marshal(doc)
}

// Alert is one entry of Prometheus's /api/v1/alerts.
type Alert struct {
	Labels   map[string]string `json:"labels"`
	State    string            `json:"state"` // pending or firing; a resolved alert is not listed
	ActiveAt time.Time         `json:"activeAt"`
}

// Prom is a client of a Prometheus's HTTP API.
type Prom struct {
	Base   string // http://host:port
	client *http.Client
}

// NewProm returns a client of the Prometheus at base.
func NewProm(base string) *Prom {
	return &Prom{Base: base, client: &http.Client{Timeout: 10 * time.Second}}
}

func (p *Prom) get(ctx context.Context, path string, q url.Values, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.Base+path+"?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	res, err := p.client.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return err
	}
	var env struct {
		Status string          `json:"status"`
		Data   json.RawMessage `json:"data"`
		Error  string          `json:"error"`
	}
	if err := json.Unmarshal(b, &env); err != nil {
		return fmt.Errorf("GET %s: %d %s", path, res.StatusCode, bytes.TrimSpace(b))
	}
	if env.Status != "success" {
		return fmt.Errorf("GET %s %s: %s", path, q.Encode(), env.Error)
	}
	return json.Unmarshal(env.Data, out)
}

// Alerts returns the pending and firing alerts.
func (p *Prom) Alerts(ctx context.Context) ([]Alert, error) {
	var d struct {
		Alerts []Alert `json:"alerts"`
	}
	err := p.get(ctx, "/api/v1/alerts", nil, &d)
	return d.Alerts, err
}

// Series is one series of a query's answer.
type Series struct {
	Metric map[string]string `json:"metric"`
	Value  []any             `json:"value"`  // instant query: [time, "value"]
	Values [][]any           `json:"values"` // range query
}

// Query runs an instant query now.
func (p *Prom) Query(ctx context.Context, expr string) ([]Series, error) {
	var d struct {
		Result []Series `json:"result"`
	}
	err := p.get(ctx, "/api/v1/query", url.Values{"query": {expr}}, &d)
	return d.Result, err
}

// QueryRange runs a range query from start to end at step.
func (p *Prom) QueryRange(ctx context.Context, expr string, start, end time.Time, step time.Duration) ([]Series, error) {
	var d struct {
		Result []Series `json:"result"`
	}
	err := p.get(ctx, "/api/v1/query_range", url.Values{"query": {expr},
		"start": {fmt.Sprint(start.Unix())}, "end": {fmt.Sprint(end.Unix())}, "step": {fmt.Sprint(step.Seconds())}}, &d)
	return d.Result, err
}

// RuleGroups returns the names of the loaded rule groups and their rule counts.
func (p *Prom) RuleGroups(ctx context.Context) (map[string]int, error) {
	var d struct {
		Groups []struct {
			Name  string            `json:"name"`
			Rules []json.RawMessage `json:"rules"`
		} `json:"groups"`
	}
	if err := p.get(ctx, "/api/v1/rules", nil, &d); err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, g := range d.Groups {
		out[g.Name] = len(g.Rules)
	}
	return out, nil
}

// States returns the state of each alert named in the list ("pending", "firing"),
// the worst of its instances; an alert not listed is inactive or resolved.
func States(alerts []Alert) map[string]string {
	out := map[string]string{}
	for _, a := range alerts {
		name := a.Labels["alertname"]
		if out[name] != "firing" {
			out[name] = a.State
		}
	}
	return out
}

// Names returns the alert names of a States map, sorted, with their state.
func Names(states map[string]string) []string {
	var out []string
	for n, s := range states {
		out = append(out, n+"="+s)
	}
	sort.Strings(out)
	return out
}

// Gate forwards TCP from listen to target until Refuse, which closes every open
// connection and each new one at once (a database refusing connections), until Allow.
type Gate struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	refuse bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// NewGate listens on listen (host:port) and forwards to target.
func NewGate(listen, target string) (*Gate, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	g := &Gate{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	g.wg.Add(1)
	go g.accept()
	return g, nil
}

// Addr is the gate's host:port.
func (g *Gate) Addr() string { return g.ln.Addr().String() }

func (g *Gate) track(c net.Conn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.refuse {
		return false
	}
	g.conns[c] = struct{}{}
	return true
}

func (g *Gate) untrack(cs ...net.Conn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, c := range cs {
		delete(g.conns, c)
		_ = c.Close()
	}
}

func (g *Gate) accept() {
	defer g.wg.Done()
	for {
		c, err := g.ln.Accept()
		if err != nil {
			return
		}
		if !g.track(c) {
			_ = c.Close()
			continue
		}
		s, err := net.DialTimeout("tcp", g.target, time.Second)
		if err != nil || !g.track(s) {
			if s != nil {
				_ = s.Close()
			}
			g.untrack(c)
			continue
		}
		g.wg.Add(2)
		go func() { defer g.wg.Done(); _, _ = io.Copy(s, c); g.untrack(c, s) }()
		go func() { defer g.wg.Done(); _, _ = io.Copy(c, s); g.untrack(c, s) }()
	}
}

// Refuse closes every connection and each new one until Allow.
func (g *Gate) Refuse() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.refuse = true
	for c := range g.conns {
		_ = c.Close()
		delete(g.conns, c)
	}
}

// Allow lets connections through again.
func (g *Gate) Allow() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.refuse = false
}

// Close stops the gate and waits for its goroutines.
func (g *Gate) Close() {
	_ = g.ln.Close()
	g.Refuse()
	g.wg.Wait()
}
