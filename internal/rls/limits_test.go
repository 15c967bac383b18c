package rls_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/quotaplane/quotaplane/internal/rls"
)

// serveLimits starts the gRPC server with l on a loopback port and returns its address.
func serveLimits(t *testing.T, l rls.Limits) string {
	t.Helper()
	opts, err := rls.ServerOptions(l)
	if err != nil {
		t.Fatal(err)
	}
	g, _ := rls.NewServer(rls.Deps{}, opts...)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	return ln.Addr().String()
}

// selfSigned writes a certificate for 127.0.0.1 and its key as PEM files in dir and
// returns their paths and a pool trusting it.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "quotaplane-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

func healthCheck(ctx context.Context, addr string, creds credentials.TransportCredentials) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

// With QUOTA_GRPC_TLS_CERT and _KEY the server speaks TLS only; a bad pair is refused
// at start.
func TestGRPCServesTLS(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t, t.TempDir())
	addr := serveLimits(t, rls.Limits{CertFile: certFile, KeyFile: keyFile})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := healthCheck(ctx, addr, credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})); err != nil {
		t.Fatalf("a TLS client: %v", err)
	}
	short, cancel2 := context.WithTimeout(ctx, time.Second)
	defer cancel2()
	if err := healthCheck(short, addr, insecure.NewCredentials()); err == nil {
		t.Error("a plaintext client was answered by the TLS server")
	}
	if _, err := rls.ServerOptions(rls.Limits{CertFile: certFile, KeyFile: certFile}); err == nil {
		t.Error("a certificate given as its own key was accepted")
	}
}

// MaxStreams bounds the calls one connection has in flight: with 1, a health Watch (a
// stream that stays open) makes the next call on the connection wait.
func TestGRPCMaxStreams(t *testing.T) {
	addr := serveLimits(t, rls.Limits{MaxStreams: 1})
	hc := plainHealthClient(t, addr)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil { // the stream is open on the server
		t.Fatal(err)
	}
	short, cancel2 := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel2()
	if _, err := hc.Check(short, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("a second call beside an open stream with MaxStreams 1: %v, want it to wait (DeadlineExceeded)", err)
	}
	cancel() // the watch ends: the next call goes through
	ok, cancel3 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel3()
	if _, err := hc.Check(ok, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("after the stream ended: %v", err)
	}
}

// Stream workers are kept goroutines, never a bound: with 2 workers both held by open
// streams (health Watch), other calls are still answered at once, each on a goroutine
// of its own.
func TestGRPCStreamWorkersNeverMakeACallWait(t *testing.T) {
	addr := serveLimits(t, rls.Limits{StreamWorkers: 2})
	hc := plainHealthClient(t, addr)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 3 { // more open streams than workers
		w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			_, err := hc.Check(c, &healthpb.HealthCheckRequest{})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a call beside streams holding every worker: %v", err)
		}
	}
}

// plainHealthClient is a health client over a plaintext connection to addr, closed
// when the test ends.
func plainHealthClient(t *testing.T, addr string) healthpb.HealthClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

// A connection that sends no HTTP/2 preface is closed by the handshake deadline: 50
// raw TCP connections that send nothing are all closed by the server within
// HandshakeTimeout (plus scheduling slack), on its default too, while a real client
// connecting after them is served. Without a deadline grpc-go waits 120 s.
func TestSilentConnectionsAreClosedAtTheHandshakeDeadline(t *testing.T) {
	for _, c := range []struct {
		name     string
		timeout  time.Duration // Limits.HandshakeTimeout
		deadline time.Duration // what the test allows
	}{
		{"set", 300 * time.Millisecond, 300*time.Millisecond + time.Second},
		{"default", 0, rls.DefaultHandshakeTimeout + time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			addr := serveLimits(t, rls.Limits{HandshakeTimeout: c.timeout})
			const n = 50
			start := time.Now()
			conns := make([]net.Conn, n)
			for i := range conns {
				conn, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = conn.Close() })
				conns[i] = conn
			}
			if err := healthCheck(context.Background(), addr, insecure.NewCredentials()); err != nil {
				t.Fatalf("a client beside the silent connections: %v", err)
			}
			var wg sync.WaitGroup
			closedAfter := make([]time.Duration, n)
			for i, conn := range conns {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_ = conn.SetReadDeadline(start.Add(c.deadline + time.Second))
					// The server sends its settings first, then closes: read to EOF.
					var buf [512]byte
					for {
						if _, err := conn.Read(buf[:]); err != nil {
							var ne net.Error
							if errors.As(err, &ne) && ne.Timeout() {
								closedAfter[i] = -1
								return
							}
							closedAfter[i] = time.Since(start)
							return
						}
					}
				}()
			}
			wg.Wait()
			for i, d := range closedAfter {
				if d < 0 || d > c.deadline {
					t.Fatalf("silent connection %d: closed after %v (-1: still open), want within %v", i, d, c.deadline)
				}
			}
		})
	}
}
