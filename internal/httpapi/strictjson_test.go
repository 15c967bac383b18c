package httpapi

import (
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
)

// The shapes decodeStrict walks name exactly the fields of the requests they stand
// for (their json tags): a field added to the spec is not refused as unknown, nor one
// dropped still admitted.
func TestShapesAreTheRequests(t *testing.T) {
	for _, tc := range []struct {
		sh *shape
		v  any
	}{
		{checkShape, api.CheckRequest{}}, {batchShape, api.BatchCheckRequest{}}, {reservationShape, api.ReservationRequest{}},
		{commitShape, api.CommitRequest{}}, {extendShape, api.ExtendRequest{}},
		{leaseShape, api.LeaseRequest{}}, {leaseSettleShape, api.LeaseSettleRequest{}},
	} {
		typ := reflect.TypeOf(tc.v)
		var tags, names []string
		for i := range typ.NumField() {
			name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
			tags = append(tags, name)
		}
		for name := range tc.sh.fields {
			names = append(names, name)
		}
		slices.Sort(tags)
		slices.Sort(names)
		if !slices.Equal(tags, names) {
			t.Errorf("%s: the shape names %v, the request %v", typ.Name(), names, tags)
		}
	}
	if batchShape.fields["checks"].elem != checkShape {
		t.Errorf("a batch's checks are not checks")
	}
}

// isInt64 admits exactly what strconv.ParseInt does of a JSON number.
func TestIsInt64(t *testing.T) {
	for _, s := range []string{"0", "-0", "7", "-7", "9223372036854775807", "9223372036854775808", "-9223372036854775808",
		"-9223372036854775809", "10000000000000000000", "1e3", "1.0", "-", "", "99999999999999999999"} {
		_, err := strconv.ParseInt(s, 10, 64)
		if got := isInt64([]byte(s)); got != (err == nil) {
			t.Errorf("isInt64(%q) = %v", s, got)
		}
	}
}
