package httpapi

import (
	"strconv"
	"strings"

	"github.com/quotaplane/quotaplane/internal/derrors"
)

// jsonBody reports whether a request body sent with Content-Type ct is read as JSON.
// One rule for every route that takes a body, admin and checks alike: no header,
// application/json, any +json type, and application/x-www-form-urlencoded, which is
// what `curl -d` sends (its bytes are parsed as JSON, never form-decoded); parameters
// such as charset are ignored. Anything else is refused with 415. It does not
// allocate: /v1/check asks it on every request.
func jsonBody(ct string) bool {
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	ct = strings.TrimSpace(ct)
	if ct == "" {
		return true
	}
	slash := strings.IndexByte(ct, '/')
	if slash <= 0 || slash == len(ct)-1 {
		return false
	}
	typ, sub := ct[:slash], ct[slash+1:]
	if len(sub) > len("+json") && strings.EqualFold(sub[len(sub)-len("+json"):], "+json") {
		return true
	}
	return strings.EqualFold(typ, "application") &&
		(strings.EqualFold(sub, "json") || strings.EqualFold(sub, "x-www-form-urlencoded"))
}

// unsupportedMediaType is the detail of the 415 answered when jsonBody(ct) is false.
func unsupportedMediaType(ct string) string {
	if len(ct) > 100 {
		ct = ct[:100] + "..."
	}
	return "Content-Type must be application/json, not " + strconv.Quote(ct)
}

// errUnsupportedMediaType is the refusal (415) of a body sent as ct.
func errUnsupportedMediaType(ct string) error {
	return derrors.E(derrors.UnsupportedMediaType, unsupportedMediaType(ct), nil)
}
