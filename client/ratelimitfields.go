package client

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Quotaplane answers checks and reservations with two generations of RateLimit header
// fields (its server's QUOTA_RATELIMIT_HEADERS may turn either off):
//
//   - the legacy RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset (seconds) of
//     the tightest limit (draft-06 of the IETF draft);
//   - the structured fields of draft-ietf-httpapi-ratelimit-headers-11:
//     RateLimit-Policy, one item per limit of the path (`"user-minute";q=20;w=60`),
//     and RateLimit, the tightest (`"user-minute";r=0;t=42`).
//
// The client reads both: RateLimit from the legacy fields when present, else from the
// draft's; Policies from RateLimit-Policy.

// Policy is one item of a RateLimit-Policy field: a quota policy.
type Policy struct {
	Name string // Quotaplane's: "<level>-<window>", or "<metric>-<level>-<window>" for a metric other than requests
	// Quota is the q parameter: the limit, in Unit.
	Quota int64
	// Window is the w parameter; 0 when the policy has none (Quotaplane: a month, a
	// concurrent limit).
	Window time.Duration
	// Unit is the qu parameter: "" (requests, the draft's default),
	// "concurrent-requests", or the metric's name.
	Unit string
	// PartitionKey is the pk parameter, nil without one (Quotaplane sends none).
	PartitionKey []byte
}

// ServiceLimit is one item of a RateLimit field: what is left under a policy.
type ServiceLimit struct {
	Name      string // the policy's
	Remaining int64  // the r parameter
	// Reset is the t parameter, in seconds; HasReset is false without one.
	Reset        time.Duration
	HasReset     bool
	PartitionKey []byte
}

// ErrMalformedField is returned for a RateLimit-Policy or RateLimit field that is not
// a valid structured-field List of the draft's items; the draft says to ignore such a
// field.
var ErrMalformedField = errors.New("malformed RateLimit field")

// name reads an item's name: a String (draft-11), or a Token (draft-10 allowed both).
func (it sfItem) name() (string, bool) {
	if it.val.kind == sfString || it.val.kind == sfToken {
		return it.val.str, true
	}
	return "", false
}

// ParsePolicies parses the RateLimit-Policy field (every line of it). Items without
// a non-negative integer q, with a w that is not a positive integer, a qu that is
// not a string or a pk that is not a byte sequence make the whole field malformed.
func ParsePolicies(values []string) ([]Policy, error) {
	items, err := parseSFList(values)
	if err != nil {
		return nil, errors.Join(ErrMalformedField, err)
	}
	out := make([]Policy, 0, len(items))
	for _, it := range items {
		var p Policy
		var ok bool
		if p.Name, ok = it.name(); !ok {
			return nil, ErrMalformedField
		}
		q, ok := it.param("q")
		if !ok || q.kind != sfInteger || q.num < 0 {
			return nil, ErrMalformedField
		}
		p.Quota = q.num
		if w, ok := it.param("w"); ok {
			if w.kind != sfInteger || w.num <= 0 {
				return nil, ErrMalformedField
			}
			p.Window = time.Duration(w.num) * time.Second
		}
		if qu, ok := it.param("qu"); ok {
			if qu.kind != sfString {
				return nil, ErrMalformedField
			}
			p.Unit = qu.str
		}
		if p.PartitionKey, err = partitionKey(it); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// ParseServiceLimits parses the RateLimit field (every line of it). Items without a
// non-negative integer r, with a t that is not a non-negative integer or a pk that is
// not a byte sequence make the whole field malformed.
func ParseServiceLimits(values []string) ([]ServiceLimit, error) {
	items, err := parseSFList(values)
	if err != nil {
		return nil, errors.Join(ErrMalformedField, err)
	}
	out := make([]ServiceLimit, 0, len(items))
	for _, it := range items {
		var l ServiceLimit
		var ok bool
		if l.Name, ok = it.name(); !ok {
			return nil, ErrMalformedField
		}
		r, ok := it.param("r")
		if !ok || r.kind != sfInteger || r.num < 0 {
			return nil, ErrMalformedField
		}
		l.Remaining = r.num
		if t, ok := it.param("t"); ok {
			if t.kind != sfInteger || t.num < 0 {
				return nil, ErrMalformedField
			}
			l.Reset, l.HasReset = time.Duration(t.num)*time.Second, true
		}
		if l.PartitionKey, err = partitionKey(it); err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}

func partitionKey(it sfItem) ([]byte, error) {
	pk, ok := it.param("pk")
	if !ok {
		return nil, nil
	}
	if pk.kind != sfBinary {
		return nil, ErrMalformedField
	}
	return pk.bytes, nil
}

// draftRateLimit reads the draft-11 fields of h: the first RateLimit item, its limit
// from the RateLimit-Policy item of the same name (0 when there is none), and every
// policy. ok is false without a well-formed RateLimit field.
func draftRateLimit(h http.Header) (RateLimit, []Policy, bool) {
	policies, err := ParsePolicies(h.Values("RateLimit-Policy"))
	if err != nil {
		policies = nil // malformed: ignored, as the draft says
	}
	limits, err := ParseServiceLimits(h.Values("RateLimit"))
	if err != nil || len(limits) == 0 {
		return RateLimit{}, policies, false
	}
	l := limits[0]
	rl := RateLimit{Remaining: l.Remaining, Reset: l.Reset, Policy: l.Name}
	for _, p := range policies {
		if p.Name == l.Name {
			rl.Limit = p.Quota
			break
		}
	}
	return rl, policies, true
}

// FormatPolicies writes policies as a RateLimit-Policy field, as Quotaplane sends it
// (`"user-minute";q=20;w=60, "tokens-user-month";q=5000;qu="tokens"`), for a service
// that passes Quotaplane's policies on to its own callers (client/middleware does).
// Names and units that a structured-field String cannot hold unescaped are escaped;
// partition keys are left out (Quotaplane sends none).
func FormatPolicies(policies []Policy) string {
	var b strings.Builder
	for i, p := range policies {
		if i > 0 {
			b.WriteString(", ")
		}
		writeSFString(&b, p.Name)
		b.WriteString(";q=")
		b.WriteString(strconv.FormatInt(p.Quota, 10))
		if p.Window > 0 {
			b.WriteString(";w=")
			b.WriteString(strconv.FormatInt(int64(p.Window/time.Second), 10))
		}
		if p.Unit != "" {
			b.WriteString(";qu=")
			writeSFString(&b, p.Unit)
		}
	}
	return b.String()
}

// writeSFString writes s as a structured-field String: quoted, with '"' and '\\'
// escaped (other characters outside printable ASCII cannot be in one and are dropped).
func writeSFString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c >= 0x20 && c <= 0x7e:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
}
