package rls

import (
	"crypto/tls"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
)

// Limits are the gRPC server's transport settings: TLS, and bounds on what one client
// connection may hold and how often it may ping. NewServer takes them as options
// (ServerOptions).
type Limits struct {
	// CertFile and KeyFile (QUOTA_GRPC_TLS_CERT, QUOTA_GRPC_TLS_KEY), both or neither,
	// serve TLS (1.2 at least); neither: plaintext, for a sidecar or a mesh that
	// encrypts (docs/ENVOY.md).
	CertFile, KeyFile string
	// MaxStreams (QUOTA_GRPC_MAX_STREAMS, default DefaultMaxStreams) bounds the
	// concurrent calls of one HTTP/2 connection; more wait in the client for a stream.
	MaxStreams uint32
	// KeepaliveMinTime (QUOTA_GRPC_KEEPALIVE_MIN_TIME, default DefaultKeepaliveMinTime)
	// is the shortest interval between a client's pings the server accepts: a client
	// pinging more often is sent GOAWAY (too_many_pings) and its connection closed.
	KeepaliveMinTime time.Duration
	// StreamWorkers (QUOTA_GRPC_STREAM_WORKERS, default DefaultStreamWorkers; 0 here
	// takes the default, negative none) is the number of long-lived goroutines that
	// run calls (grpc.NumStreamWorkers); a call that finds them all busy gets a
	// goroutine of its own, as without them. A new goroutine per call starts on a small
	// stack that the rate limit service's handler outgrows, and copying it
	// (runtime.newstack, copystack) is a large share of the api's CPU on the
	// three-descriptor path; the workers' stacks have already grown
	// (docs/PERFORMANCE.md, "The gRPC path's stacks").
	StreamWorkers int
	// HandshakeTimeout (QUOTA_GRPC_HANDSHAKE_TIMEOUT, default DefaultHandshakeTimeout)
	// is how long a new connection has to finish its TLS handshake and send the
	// HTTP/2 preface and settings (grpc.ConnectionTimeout): one that sends nothing is
	// closed then, so idle sockets cannot hold the file descriptors the api shares
	// with its HTTP listener. Envoy sends its preface at once.
	HandshakeTimeout time.Duration
}

// Defaults of Limits.
const (
	DefaultMaxStreams       = 1024
	DefaultKeepaliveMinTime = 10 * time.Second
	DefaultStreamWorkers    = 128
	DefaultHandshakeTimeout = 5 * time.Second
)

// ServerOptions returns the options that apply l: TLS credentials when a certificate
// is set, MaxConcurrentStreams, the stream workers, the handshake deadline, the
// keepalive enforcement policy (pings without a call in flight are allowed, as
// Envoy's connection keepalive sends them) and server pings that close a connection
// whose client went silent (every 1 min, 20 s to answer).
//
// Errors: a certificate or key that cannot be read or does not match.
func ServerOptions(l Limits) ([]grpc.ServerOption, error) {
	if l.MaxStreams == 0 {
		l.MaxStreams = DefaultMaxStreams
	}
	if l.KeepaliveMinTime <= 0 {
		l.KeepaliveMinTime = DefaultKeepaliveMinTime
	}
	if l.StreamWorkers == 0 {
		l.StreamWorkers = DefaultStreamWorkers
	}
	if l.HandshakeTimeout <= 0 {
		l.HandshakeTimeout = DefaultHandshakeTimeout
	}
	opts := []grpc.ServerOption{
		grpc.ConnectionTimeout(l.HandshakeTimeout),
		grpc.MaxConcurrentStreams(l.MaxStreams),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: l.KeepaliveMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: time.Minute, Timeout: 20 * time.Second}),
	}
	if l.StreamWorkers > 0 {
		opts = append(opts, grpc.NumStreamWorkers(uint32(l.StreamWorkers)))
	}
	if l.CertFile == "" && l.KeyFile == "" {
		return opts, nil
	}
	cert, err := tls.LoadX509KeyPair(l.CertFile, l.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("gRPC TLS certificate %s and key %s: %w", l.CertFile, l.KeyFile, err)
	}
	creds := credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	return append(opts, grpc.Creds(creds)), nil
}
