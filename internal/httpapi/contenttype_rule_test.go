package httpapi

import "testing"

func TestJSONBodyRule(t *testing.T) {
	for ct, want := range map[string]bool{
		"":                                  true,
		"   ":                               true,
		"application/json":                  true,
		"application/json; charset=utf-8":   true,
		"APPLICATION/Json":                  true,
		"application/problem+json":          true,
		"application/vnd.acme.check+JSON":   true,
		"application/x-www-form-urlencoded": true,
		"application/x-www-form-urlencoded; charset=UTF-8": true,
		"text/plain":                      false,
		"text/json":                       false,
		"multipart/form-data; boundary=x": false,
		"application/xml":                 false,
		"application/jsonp":               false,
		"application/+json":               false,
		"json":                            false,
		"application/":                    false,
		"/json":                           false,
		"+json":                           false,
	} {
		if got := jsonBody(ct); got != want {
			t.Errorf("jsonBody(%q) = %v, want %v", ct, got, want)
		}
	}
}

// The check route asks on every request: the rule must cost no allocation.
func TestJSONBodyRuleDoesNotAllocate(t *testing.T) {
	for _, ct := range []string{"application/json; charset=utf-8", "application/x-www-form-urlencoded", "text/plain", ""} {
		if n := testing.AllocsPerRun(100, func() { _ = jsonBody(ct) }); n != 0 {
			t.Errorf("jsonBody(%q) allocates %v times", ct, n)
		}
	}
}
