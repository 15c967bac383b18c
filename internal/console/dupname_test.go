package console_test

import (
	"net/http"
	"strings"
	"testing"
)

// The console's own bodies refuse a field named twice, as every route of the API
// does, naming it: a sign-in is not made, a password not changed.
func TestConsoleBodiesRefuseAFieldNamedTwice(t *testing.T) {
	e := mustEnv(t)
	res := e.do(t, req{method: "POST", path: "/console/api/sign-in",
		body: `{"org":"acme","email":"nobody@acme.test","email":"` + adminEmail + `","password":"` + password + `"}`})
	if text := body(t, res); res.StatusCode != http.StatusBadRequest || sessionCookie(res) != nil ||
		!strings.Contains(text, `"errors":[{"field":"email","message":"field named twice (send each field once)"}]`) {
		t.Errorf("sign-in naming email twice = %d %s, want a 400 naming email and no session", res.StatusCode, text)
	}
	id, csrf := e.mustSignIn(t, adminEmail)
	res = e.do(t, req{method: "POST", path: "/console/api/password", cookie: id, csrf: csrf,
		body: `{"current_password":"` + password + `","new_password":"a new one, long enough","new_password":"another new one, long enough"}`})
	if text := body(t, res); res.StatusCode != http.StatusBadRequest ||
		!strings.Contains(text, `"field":"new_password","message":"field named twice (send each field once)"`) {
		t.Errorf("password change naming new_password twice = %d %s, want a 400 naming it", res.StatusCode, text)
	}
	e.mustSignIn(t, adminEmail) // the password is as it was
}
