package rls_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// latin1Codec sends what Envoy sends for a header of Latin-1 bytes: it marshals with
// proto, then writes the bytes of placeholder as latin1, which is not UTF-8 (Go's
// proto refuses to marshal such a string; Envoy's C++ protobuf writes it as it is).
type latin1Codec struct{}

const placeholder, latin1 = "PLACEHOLDER", "Espa\xf1a\xff"

func (latin1Codec) Marshal(v any) (mem.BufferSlice, error) {
	b, err := proto.Marshal(v.(proto.Message))
	b = bytes.ReplaceAll(b, []byte(placeholder), []byte(latin1+"...."))
	return mem.BufferSlice{mem.SliceBuffer(b)}, err
}

func (latin1Codec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}

func (latin1Codec) Name() string { return "proto" }

// A header value that is not UTF-8 (HTTP allows bytes 0x80-0xFF) reaches the
// service in a descriptor as Envoy copied it. The call is answered, not failed: the
// descriptor is OVER_LIMIT for itself and the org's [metric=requests] beside it is
// decided and counted, as for any other malformed id.
func TestDescriptorValueNotUTF8IsRefusedAlone(t *testing.T) {
	if len(placeholder) != len(latin1+"....") {
		t.Fatal("the placeholder and its replacement must have one length")
	}
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "r"))
	key := r.setup("acme", 10)
	for _, ds := range [][]*ratelimitv3.RateLimitDescriptor{
		{desc(entry{"team", "eng"}), desc(entry{"team", "eng"}, entry{"user", placeholder}), desc(entry{"metric", "requests"})},
		{desc(entry{"team", placeholder}), desc(entry{"team", placeholder}, entry{"user", "alice"}), desc(entry{"metric", "requests"})},
		{desc(entry{placeholder, "eng"}), desc(entry{"metric", "requests"})},
	} {
		before := r.usedAt(key, `{"org":"acme"}`, "requests")
		ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+key)
		res, err := r.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: placeholder, Descriptors: ds}, grpc.ForceCodecV2(latin1Codec{}))
		if err != nil {
			t.Fatalf("a descriptor value that is not UTF-8 failed the call: %v", err)
		}
		if res.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || len(res.Statuses) != len(ds) {
			t.Fatalf("answer %v with %d statuses, want OVER_LIMIT with %d", res.OverallCode, len(res.Statuses), len(ds))
		}
		if last := res.Statuses[len(ds)-1]; last.Code != rlsv3.RateLimitResponse_OK {
			t.Errorf("the org's [metric=requests] is %v, want OK", last.Code)
		}
		if refused := headerOf(res, "Quotaplane-Refused"); !strings.Contains(refused, "Espa\uFFFDa\uFFFD") {
			t.Errorf("Quotaplane-Refused = %q, want the value with U+FFFD for its bad bytes", refused)
		}
		if got := r.usedAt(key, `{"org":"acme"}`, "requests") - before; got != 1 {
			t.Errorf("the org's requests moved by %d, want 1", got)
		}
	}
}
