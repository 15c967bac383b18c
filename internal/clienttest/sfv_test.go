package clienttest

import (
	"testing"
	"time"

	"github.com/dunglas/httpsfv"
	"github.com/google/go-cmp/cmp"

	"github.com/quotaplane/quotaplane/client"
)

// The client module is standard-library only, so it parses the draft-11 RateLimit
// fields with its own small structured-field parser. Here it is held to
// github.com/dunglas/httpsfv: on every field below, valid or not, the client answers
// what the draft's rules applied to httpsfv's parse answer.

var policyFields = []string{
	`"org-month";q=1000, "team-minute";q=100;w=60, "user-minute";q=20;w=60`,
	`"tokens-user-minute";q=100000;w=60;qu="tokens", "user-concurrent";q=5;qu="concurrent-requests"`,
	`"burst";q=100;w=60,"daily";q=1000;w=86400`,
	`burst;q=100;w=60`,
	`"peruser";q=100;w=60;pk=:cHsdsRa8:`,
	`  "a";q=1  ,  "b";q=2;w=3  `,
	`"a";q=1;q=2`,
	`"a";q=1;x;acme-burst=?1;y=1.5;z=tok/en:x;d=@1700000000`,
	`"esc\"aped\\";q=0`,
	``,
	`"a";q=-1`,
	`"a";w=60`,
	`"a";q=1.5`,
	`"a";q="1"`,
	`"a";q=1;w=0`,
	`"a";q=1;qu=tokens`,
	`"a";q=1;pk="x"`,
	`"a";q=1,`,
	`"a";q=1,,"b";q=2`,
	`"a";Q=1`,
	`"a";q=1234567890123456`,
	`"a";q=1;y=1234567890123.5`,
	`"a";q=1;y=1.2345`,
	`1;q=1`,
	`("a" "b");q=1`,
	`"unterminated;q=1`,
	`"a";q=1 "b";q=2`,
	`"a";q=1;pk=:not base64!:`,
	`"a";q=1;pk=:YQ:`,
	"\"tab\tinside\";q=1",
	`"a";q=1;b=?2`,
}

var limitFields = []string{
	`"user-minute";r=0;t=42`,
	`"default";r=50;t=30`,
	`"default";r=999;pk=:dHJpYWwxMjEzMjM=:`,
	`"a";r=1, "b";r=2;t=3`,
	`"a";t=3`,
	`"a";r=-1;t=3`,
	`"a";r=1;t=-1`,
	`"a";r=1;t=1.0`,
	`"a";r=1;;t=2`,
	`?1;r=1`,
}

// libraryItems parses field with httpsfv and applies the draft's item rules: a name
// (String or Token) and integer, string and byte-sequence parameters as fn reads them.
func libraryItems[T any](field string, fn func(name string, p *httpsfv.Params) (T, bool)) ([]T, bool) {
	l, err := httpsfv.UnmarshalList([]string{field})
	if err != nil {
		return nil, false
	}
	out := make([]T, 0, len(l))
	for _, m := range l {
		it, ok := m.(httpsfv.Item)
		if !ok {
			return nil, false // an inner list
		}
		var name string
		switch v := it.Value.(type) {
		case string:
			name = v
		case httpsfv.Token:
			name = string(v)
		default:
			return nil, false
		}
		x, ok := fn(name, it.Params)
		if !ok {
			return nil, false
		}
		out = append(out, x)
	}
	return out, true
}

func intParam(p *httpsfv.Params, k string, min int64, required bool) (int64, bool, bool) {
	v, ok := p.Get(k)
	if !ok {
		return 0, false, !required
	}
	n, isInt := v.(int64)
	return n, true, isInt && n >= min
}

func pkParam(p *httpsfv.Params) ([]byte, bool) {
	v, ok := p.Get("pk")
	if !ok {
		return nil, true
	}
	b, isBytes := v.([]byte)
	return b, isBytes
}

func TestClientFieldParserAgreesWithHTTPSFV(t *testing.T) {
	for _, f := range policyFields {
		want, wantOK := libraryItems(f, func(name string, p *httpsfv.Params) (client.Policy, bool) {
			pol := client.Policy{Name: name}
			q, _, ok := intParam(p, "q", 0, true)
			if !ok {
				return pol, false
			}
			pol.Quota = q
			w, has, ok := intParam(p, "w", 1, false)
			if !ok {
				return pol, false
			}
			if has {
				pol.Window = time.Duration(w) * time.Second
			}
			if qu, has := p.Get("qu"); has {
				s, isString := qu.(string)
				if !isString {
					return pol, false
				}
				pol.Unit = s
			}
			pol.PartitionKey, ok = pkParam(p)
			return pol, ok
		})
		got, err := client.ParsePolicies([]string{f})
		if (err == nil) != wantOK {
			t.Errorf("RateLimit-Policy %q: client error %v, httpsfv and the draft's rules ok %v", f, err, wantOK)
			continue
		}
		if d := cmp.Diff(want, got); wantOK && d != "" {
			t.Errorf("RateLimit-Policy %q (-httpsfv +client):\n%s", f, d)
		}
	}
	for _, f := range limitFields {
		want, wantOK := libraryItems(f, func(name string, p *httpsfv.Params) (client.ServiceLimit, bool) {
			l := client.ServiceLimit{Name: name}
			r, _, ok := intParam(p, "r", 0, true)
			if !ok {
				return l, false
			}
			l.Remaining = r
			tv, has, ok := intParam(p, "t", 0, false)
			if !ok {
				return l, false
			}
			if has {
				l.Reset, l.HasReset = time.Duration(tv)*time.Second, true
			}
			l.PartitionKey, ok = pkParam(p)
			return l, ok
		})
		got, err := client.ParseServiceLimits([]string{f})
		if (err == nil) != wantOK {
			t.Errorf("RateLimit %q: client error %v, httpsfv and the draft's rules ok %v", f, err, wantOK)
			continue
		}
		if d := cmp.Diff(want, got); wantOK && d != "" {
			t.Errorf("RateLimit %q (-httpsfv +client):\n%s", f, d)
		}
	}
	// Several field lines are one list, as RFC 9110 combines them.
	got, err := client.ParsePolicies([]string{`"a";q=1`, `"b";q=2;w=60`})
	if d := cmp.Diff([]client.Policy{{Name: "a", Quota: 1}, {Name: "b", Quota: 2, Window: time.Minute}}, got); err != nil || d != "" {
		t.Errorf("two lines: %v (-want +got):\n%s", err, d)
	}
}
