package httpapi

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/go-chi/chi/v5/middleware"
)

// The request's state, one allocation. chi's middleware.RequestID (a formatted id, a
// context value and a copy of the request), the metrics middleware's response writer
// (chi's WrapResponseWriter) and authenticate's principal (another context value and
// request copy) would each allocate per check (BenchmarkServerCheck). requestState is
// all three in one context: its Value answers chi's middleware.RequestIDKey (so
// middleware.GetReqID and every reader of the id work unchanged), principalKey{} and
// stateKey{}.

// stateKey finds a request's *requestState in its context.
type stateKey struct{}

// requestState is a request's context: its id, its authenticated caller and the
// metrics' response writer.
type requestState struct {
	context.Context
	id    uint64 // chi's request counter; 0 when the client gave its id
	given string // the X-Request-Id the client sent
	p     principal
	hasP  bool
	w     statusWriter
}

// Value answers the request id, the principal and the state itself, and asks the
// parent for every other key.
func (s *requestState) Value(key any) any {
	switch key {
	case middleware.RequestIDKey:
		return s.requestID()
	case stateKey{}:
		return s
	case principalKey{}:
		if s.hasP {
			return s.p
		}
	}
	return s.Context.Value(key)
}

// requestID is chi's id, formatted as middleware.RequestID does ("<host>/<random>-
// 000001"), only when something reads it (an error's problem, the audit log, a span).
func (s *requestState) requestID() string {
	if s.id == 0 {
		return s.given
	}
	n := strconv.FormatUint(s.id, 10)
	if len(n) < 6 {
		n = strings.Repeat("0", 6-len(n)) + n
	}
	return reqIDPrefix + "-" + n
}

// reqIDPrefix is chi's prefix of request ids, read from the id of one request through
// middleware.RequestID itself (it keeps the prefix private).
var reqIDPrefix = func() string {
	var id string
	r, _ := http.NewRequest(http.MethodGet, "/", nil)
	middleware.RequestID(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		id = middleware.GetReqID(r.Context())
	})).ServeHTTP(nil, r)
	return id[:strings.LastIndexByte(id, '-')]
}()

// stateOf is the request's state, nil outside begin.
func stateOf(ctx context.Context) *requestState {
	s, _ := ctx.Value(stateKey{}).(*requestState)
	return s
}

// begin gives the request its state, as middleware.RequestID gave it its id: the
// client's X-Request-Id, or chi's next number.
func begin(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := &requestState{Context: r.Context()}
		if s.given = r.Header.Get(middleware.RequestIDHeader); s.given == "" {
			s.id = middleware.NextRequestID()
		}
		next.ServeHTTP(w, r.WithContext(s))
	})
}

// statusWriter remembers the status of the answer, as chi's WrapResponseWriter does
// for the metrics: the first final status written (an informational one passes
// through), 200 at the first Write without one, 0 when nothing was written; a second
// WriteHeader is dropped.
type statusWriter struct {
	http.ResponseWriter
	code  int
	wrote bool
}

func (w *statusWriter) WriteHeader(code int) {
	if code >= 100 && code <= 199 && code != http.StatusSwitchingProtocols {
		w.ResponseWriter.WriteHeader(code)
		return
	}
	if !w.wrote {
		w.code, w.wrote = code, true
		w.ResponseWriter.WriteHeader(code)
	}
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

// Status is the status written, 0 if none.
func (w *statusWriter) Status() int { return w.code }

// Flush flushes the answer when the connection can (the CSV exports stream).
func (w *statusWriter) Flush() {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Hijack hands the connection over, when the server's writer can.
func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if h, ok := w.ResponseWriter.(http.Hijacker); ok {
		return h.Hijack()
	}
	return nil, nil, http.ErrNotSupported
}

// Unwrap is the writer underneath, for http.ResponseController.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
