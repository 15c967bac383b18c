package rls

import (
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	protov2 "google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// lenientCodec is gRPC's proto codec, except that a request whose string fields hold
// bytes that are not UTF-8 is read with each such byte as U+FFFD instead of being
// refused. Envoy copies a request header's bytes into a descriptor value as they
// came, and HTTP allows bytes 0x80-0xFF in a header (obs-text: "Espa\xf1a" in
// Latin-1); Envoy's C++ protobuf writes them into the string field unchanged. The
// standard codec fails such a call as INTERNAL before the handler sees it, which
// Envoy with failure_mode_deny: false forwards uncounted, the org's own descriptor
// with it. Read leniently, the value is one the id rules refuse, so that descriptor
// alone is OVER_LIMIT and the others are decided and counted.
type lenientCodec struct{ encoding.CodecV2 }

func newLenientCodec() lenientCodec {
	return lenientCodec{encoding.GetCodecV2(proto.Name)}
}

func (c lenientCodec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.CodecV2.Unmarshal(data, v)
	m, ok := v.(protov2.Message)
	if err == nil || !ok {
		return err
	}
	fixed, changed := validUTF8(data.Materialize(), m.ProtoReflect().Descriptor(), 0)
	if !changed {
		return err
	}
	return protov2.Unmarshal(fixed, m)
}

// maxNesting bounds validUTF8's recursion as protobuf's own decoder does.
const maxNesting = 100

// validUTF8 returns b, a message md in wire format, with every string field of it
// and of its messages made valid UTF-8 (strings.ToValidUTF8 with U+FFFD), and whether
// anything changed. Input it cannot parse is returned unchanged, for the standard
// decoder to refuse.
func validUTF8(b []byte, md protoreflect.MessageDescriptor, depth int) ([]byte, bool) {
	if depth > maxNesting {
		return b, false
	}
	out := make([]byte, 0, len(b))
	changed := false
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return b, false
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return b, false
		}
		field := b[:n+m]
		b = b[n+m:]
		fd := md.Fields().ByNumber(num)
		if typ != protowire.BytesType || fd == nil {
			out = append(out, field...)
			continue
		}
		v, _ := protowire.ConsumeBytes(field[n:])
		switch {
		case fd.Kind() == protoreflect.StringKind && !utf8.Valid(v):
			v = []byte(strings.ToValidUTF8(string(v), "\uFFFD"))
			changed = true
		case fd.Kind() == protoreflect.MessageKind:
			var c bool
			if v, c = validUTF8(v, fd.Message(), depth+1); c {
				changed = true
			}
		}
		out = protowire.AppendTag(out, num, typ)
		out = protowire.AppendBytes(out, v)
	}
	return out, changed
}
