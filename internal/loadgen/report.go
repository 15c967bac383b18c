package loadgen

import (
	"fmt"
	"html/template"
	"io"
	"strings"
)

// Text writes the report for a person.
func (r Report) Text(w io.Writer) {
	if r.Refused != "" {
		fmt.Fprintf(w, "REFUSED    mode %s: %s; nothing measured\n", r.Mode, r.Refused)
		return
	}
	switch r.Mode {
	case ModePairs:
		fmt.Fprintf(w, "pairs      %d acquire+release in %.1fs: %.0f pairs/s (2 requests each)\n", r.Requests, r.Seconds, r.PairsPS)
		fmt.Fprintf(w, "acquires   %d held and released, %d denied, %d errors\n", r.Allowed, r.Denied, r.Errors)
		fmt.Fprintf(w, "in flight  at most %d at an org, %d at a team, %d at a user at once\n",
			r.MaxInFlight["org"], r.MaxInFlight["team"], r.MaxInFlight["user"])
	case ModeMulti:
		fmt.Fprintf(w, "requests   %d in %.1fs: %.0f req/s, %.0f checks/s of %d metrics (%s)\n",
			r.Requests, r.Seconds, r.RPS, r.ChecksPS, len(r.Metrics), strings.Join(r.Metrics, "+"))
		fmt.Fprintf(w, "checks     %d allowed, %d denied, %d errors\n", r.Allowed, r.Denied, r.Errors)
	default:
		fmt.Fprintf(w, "requests   %d in %.1fs: %.0f req/s, %.0f checks/s\n", r.Requests, r.Seconds, r.RPS, r.ChecksPS)
		fmt.Fprintf(w, "checks     %d allowed, %d denied, %d errors\n", r.Allowed, r.Denied, r.Errors)
	}
	for _, e := range r.ErrorSample {
		fmt.Fprintln(w, "error      "+e)
	}
	fmt.Fprintf(w, "latency    p50 %.2f ms  p90 %.2f ms  p99 %.2f ms  p99.9 %.2f ms  max %.2f ms\n",
		r.LatencyMS["p50"], r.LatencyMS["p90"], r.LatencyMS["p99"], r.LatencyMS["p99.9"], r.LatencyMS["max"])
	verified := "no level admitted more than its limit"
	if r.Mode == ModePairs {
		verified = "no level held more than its concurrent limit; nothing held after the run"
	}
	writeVerified(w, r.Verified, verified, r.OverAdmit, r.VerifyNotes)
}

// writeVerified writes a run's verification: what held, or the levels over.
func writeVerified(w io.Writer, ok bool, held string, over, notes []string) {
	if ok {
		fmt.Fprintln(w, "verified   "+held)
	} else {
		fmt.Fprintf(w, "OVER-ADMISSION at %d levels:\n", len(over))
		for _, o := range over {
			fmt.Fprintln(w, "  "+o)
		}
	}
	for _, n := range notes {
		fmt.Fprintln(w, "note       "+n)
	}
}

var page = template.Must(template.New("report").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Quotaplane load report</title>
<style>body{font:14px system-ui,sans-serif;margin:2rem;color:#222}svg{background:#fafafa;border:1px solid #ddd}
.p50{stroke:#2b7bb9}.p99{stroke:#d9534f}.rps{stroke:#5cb85c}polyline{fill:none;stroke-width:2}
td{padding:.2rem .8rem}</style></head><body>
<h1>Quotaplane load report</h1>
<table><tr><td>requests</td><td>{{.R.Requests}} in {{printf "%.1f" .R.Seconds}} s</td></tr>
<tr><td>mode</td><td>{{.R.Mode}}{{if .R.Refused}}: REFUSED, {{.R.Refused}}{{end}}</td></tr>
<tr><td>throughput</td><td>{{printf "%.0f" .R.RPS}} {{.Unit}}, {{printf "%.0f" .R.ChecksPS}} checks/s</td></tr>
<tr><td>answers</td><td>{{.R.Allowed}} allowed, {{.R.Denied}} denied, {{.R.Errors}} errors</td></tr>
<tr><td>latency</td><td>p50 {{index .R.LatencyMS "p50"}} ms, p99 {{index .R.LatencyMS "p99"}} ms, p99.9 {{index .R.LatencyMS "p99.9"}} ms</td></tr>
<tr><td>verified</td><td>{{if .R.Verified}}no level over its limit{{else}}OVER-ADMISSION: {{len .R.OverAdmit}} levels{{end}}</td></tr></table>
<h2>Latency per second (ms): <span style="color:#2b7bb9">p50</span>, <span style="color:#d9534f">p99</span></h2>
<svg width="{{.W}}" height="{{.H}}" viewBox="0 0 {{.W}} {{.H}}" role="img" aria-label="latency per second">
<polyline class="p50" points="{{.P50}}"/><polyline class="p99" points="{{.P99}}"/>
<text x="4" y="14">{{printf "%.1f" .MaxMS}} ms</text><text x="4" y="{{.H}}" dy="-4">0</text></svg>
<h2>{{if eq .Unit "pairs/s"}}Pairs{{else}}Requests{{end}} per second</h2>
<svg width="{{.W}}" height="{{.H}}" viewBox="0 0 {{.W}} {{.H}}" role="img" aria-label="requests per second">
<polyline class="rps" points="{{.RPSLine}}"/><text x="4" y="14">{{.MaxRPS}} {{.Unit}}</text></svg>
</body></html>`))

// HTML writes a self-contained page with latency and throughput charts.
func (r Report) HTML(w io.Writer) error {
	const W, H = 800, 240
	var maxMS float64
	var maxRPS int64
	for _, s := range r.PerSecond {
		maxMS = max(maxMS, s.P99MS)
		maxRPS = max(maxRPS, s.Requests)
	}
	maxMS, maxRPS = max(maxMS, 1), max(maxRPS, 1)
	line := func(v func(Second) float64, top float64) string {
		var b strings.Builder
		n := max(len(r.PerSecond)-1, 1)
		for i, s := range r.PerSecond {
			fmt.Fprintf(&b, "%.1f,%.1f ", float64(i)*W/float64(n), H-v(s)/top*(H-20))
		}
		return b.String()
	}
	unit := "req/s"
	if r.Mode == ModePairs {
		unit = "pairs/s"
	}
	return page.Execute(w, map[string]any{"R": r, "Unit": unit, "W": W, "H": H, "MaxMS": maxMS, "MaxRPS": maxRPS,
		"P50":     line(func(s Second) float64 { return s.P50MS }, maxMS),
		"P99":     line(func(s Second) float64 { return s.P99MS }, maxMS),
		"RPSLine": line(func(s Second) float64 { return float64(s.Requests) }, float64(maxRPS)),
	})
}
