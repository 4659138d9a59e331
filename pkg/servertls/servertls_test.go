package servertls_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/servertls"
	"github.com/tether-dev/tether/pkg/servertls/servertlstest"
)

// served returns the serial number of the certificate a TLS handshake with addr presents, or
// the handshake error.
func served(t *testing.T, addr string, cfg *tls.Config) (string, error) {
	t.Helper()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return "", err
	}
	defer func() { _ = conn.Close() }()
	// TLS 1.3 reports a refused client certificate on the first read, not in the handshake.
	if err := conn.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return "", err
	}
	if _, err := conn.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")); err != nil {
		return "", err
	}
	if _, err := conn.Read(make([]byte, 1)); err != nil {
		return "", err
	}
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String(), nil
}

// startHTTPS serves a trivial handler over src on a loopback port.
func startHTTPS(t *testing.T, src *servertls.Source) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }),
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          slog.NewLogLogger(slog.DiscardHandler, slog.LevelError),
	}
	go func() { _ = srv.Serve(src.Listener(lis, "h2", "http/1.1")) }()
	t.Cleanup(func() { _ = srv.Close() })
	return lis.Addr().String()
}

func TestServesTLSAndHTTP2(t *testing.T) {
	ca := servertlstest.NewCA(t, "tether")
	pair := ca.Server(t, "server")
	src, err := servertls.New(servertls.Files{CertFile: pair.CertFile, KeyFile: pair.KeyFile})
	if err != nil {
		t.Fatal(err)
	}
	addr := startHTTPS(t, src)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: servertlstest.ClientConfig(ca, nil), ForceAttemptHTTP2: true}}
	resp, err := client.Get("https://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if string(body) != "ok" || resp.ProtoMajor != 2 || resp.TLS == nil {
		t.Fatalf("got %q over %s (TLS %v); want ok over HTTP/2 and TLS", body, resp.Proto, resp.TLS != nil)
	}
	// A plain-text client gets nothing useful: the listener speaks TLS only.
	resp, err = http.Get("http://" + addr + "/")
	if err == nil {
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatal("plain HTTP was served on the TLS listener")
		}
	}
	// A client that does not trust the CA is refused.
	if _, err := served(t, addr, servertlstest.ClientConfig(servertlstest.NewCA(t, "other"), nil)); err == nil {
		t.Fatal("a client trusting another CA completed the handshake")
	}
	if src.MutualTLS() {
		t.Error("MutualTLS without a client CA")
	}
}

func TestMutualTLSRefusesClientsWithoutAVerifiedCertificate(t *testing.T) {
	ca := servertlstest.NewCA(t, "tether")
	pair := ca.Server(t, "server")
	src, err := servertls.New(servertls.Files{CertFile: pair.CertFile, KeyFile: pair.KeyFile, ClientCAFile: ca.File})
	if err != nil {
		t.Fatal(err)
	}
	addr := startHTTPS(t, src)
	good := ca.Client(t, "envoy")
	other := servertlstest.NewCA(t, "other").Client(t, "intruder")
	for _, tc := range []struct {
		name   string
		client *servertlstest.Pair
		ok     bool
	}{
		{"no client certificate", nil, false},
		{"certificate from another CA", &other, false},
		{"certificate from the client CA", &good, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := served(t, addr, servertlstest.ClientConfig(ca, tc.client))
			if (err == nil) != tc.ok {
				t.Fatalf("handshake error %v; want success %v", err, tc.ok)
			}
			if !tc.ok && !strings.Contains(err.Error(), "certificate") {
				t.Errorf("refusal %q does not mention the certificate", err)
			}
		})
	}
}

// clock is a manual clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// TestRotationIsPickedUpWithoutRestart replaces the certificate files: once the check
// interval has passed the next handshake serves the new certificate; a broken rotation keeps
// the old one serving (and is logged) until the files are fixed. The client CA rotates too.
func TestRotationIsPickedUpWithoutRestart(t *testing.T) {
	ca := servertlstest.NewCA(t, "tether")
	dir := t.TempDir()
	certFile, keyFile, caFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "ca.crt")
	first, second := ca.Server(t, "first"), ca.Server(t, "second")
	servertlstest.Install(t, first, certFile, keyFile)
	copyFile(t, ca.File, caFile)
	clk := &clock{now: time.Now()}
	var logs testutil.SyncBuffer
	src, err := servertls.New(servertls.Files{CertFile: certFile, KeyFile: keyFile, ClientCAFile: caFile},
		servertls.WithClock(clk.Now), servertls.WithCheckInterval(time.Second),
		servertls.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	addr := startHTTPS(t, src)
	client := ca.Client(t, "envoy")
	cfg := servertlstest.ClientConfig(ca, &client)
	serial := func(p servertlstest.Pair) string { return p.TLS.Leaf.SerialNumber.String() }
	expect := func(what string, want servertlstest.Pair) {
		t.Helper()
		got, err := served(t, addr, cfg)
		if err != nil || got != serial(want) {
			t.Fatalf("%s: served serial %s, %v; want %s", what, got, err, serial(want))
		}
	}
	expect("at start", first)

	servertlstest.Install(t, second, certFile, keyFile)
	expect("within the check interval", first)
	clk.Advance(time.Second)
	expect("after the check interval", second)
	if !strings.Contains(logs.String(), "TLS certificate reloaded") {
		t.Errorf("the reload was not logged:\n%s", logs.String())
	}

	// A half-done rotation: the certificate file is replaced, its key not yet.
	third := ca.Server(t, "third")
	copyFile(t, third.CertFile, certFile)
	clk.Advance(time.Second)
	expect("with a mismatched key", second)
	if !strings.Contains(logs.String(), "do not load; still serving the previous certificate") {
		t.Errorf("the failed reload was not logged:\n%s", logs.String())
	}
	copyFile(t, third.KeyFile, keyFile)
	clk.Advance(time.Second)
	expect("once the key follows", third)

	// The client CA rotates: clients of the old CA are refused from then on.
	next := servertlstest.NewCA(t, "next")
	copyFile(t, next.File, caFile)
	clk.Advance(time.Second)
	if _, err := served(t, addr, cfg); err == nil {
		t.Fatal("a client of the replaced client CA is still accepted")
	}
	nextClient := next.Client(t, "envoy2")
	if _, err := served(t, addr, servertlstest.ClientConfig(ca, &nextClient)); err != nil {
		t.Fatalf("a client of the new client CA: %v", err)
	}

	// Reload reads now, regardless of the interval.
	servertlstest.Install(t, first, certFile, keyFile)
	if err := src.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, err := served(t, addr, servertlstest.ClientConfig(ca, &nextClient)); err != nil {
		t.Fatal(err)
	}
	if got := src.NotAfter(); !got.Equal(first.TLS.Leaf.NotAfter) {
		t.Errorf("NotAfter %v, want the reloaded certificate's %v", got, first.TLS.Leaf.NotAfter)
	}
}

// TestGRPCOverTLS serves gRPC (what Envoy's ext_proc and ADS clients speak) through the
// wrapped listener; a gRPC client, which insists on ALPN h2, connects.
func TestGRPCOverTLS(t *testing.T) {
	ca := servertlstest.NewCA(t, "tether")
	pair := ca.Server(t, "server")
	src, err := servertls.New(servertls.Files{CertFile: pair.CertFile, KeyFile: pair.KeyFile, ClientCAFile: ca.File})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, health.NewServer())
	go func() { _ = gs.Serve(src.Listener(lis, "h2")) }()
	defer gs.Stop()
	client := ca.Client(t, "envoy")
	for _, tc := range []struct {
		name   string
		client *servertlstest.Pair
		ok     bool
	}{{"with a client certificate", &client, true}, {"without", nil, false}} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(servertlstest.ClientConfig(ca, tc.client))))
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = conn.Close() }()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
			if (err == nil) != tc.ok {
				t.Fatalf("health check: %v; want success %v", err, tc.ok)
			}
		})
	}
}

func TestNewRefusesBadFiles(t *testing.T) {
	ca := servertlstest.NewCA(t, "tether")
	pair := ca.Server(t, "server")
	other := ca.Server(t, "other")
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "junk")
	if err := os.WriteFile(notPEM, []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]servertls.Files{
		"no files":         {},
		"missing cert":     {CertFile: filepath.Join(dir, "none"), KeyFile: pair.KeyFile},
		"mismatched key":   {CertFile: pair.CertFile, KeyFile: other.KeyFile},
		"client CA junk":   {CertFile: pair.CertFile, KeyFile: pair.KeyFile, ClientCAFile: notPEM},
		"client CA absent": {CertFile: pair.CertFile, KeyFile: pair.KeyFile, ClientCAFile: filepath.Join(dir, "none")},
	} {
		if _, err := servertls.New(f); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
	if _, err := servertls.New(servertls.Files{CertFile: pair.CertFile, KeyFile: pair.KeyFile, ClientCAFile: notPEM}); !errors.Is(err, os.ErrInvalid) {
		t.Errorf("junk client CA: %v, want ErrInvalid", err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o600); err != nil {
		t.Fatal(err)
	}
}
