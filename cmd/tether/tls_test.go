package main

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/servertls/servertlstest"
)

// startTLSServe runs serve with every listener on a free port behind tls (and a client CA
// when mutual) and returns the bound addresses.
func startTLSServe(t *testing.T, ca *servertlstest.CA, mutual bool) serveInfo {
	t.Helper()
	pair := ca.Server(t, "tether")
	dir := t.TempDir()
	cfg := testConfig(upstreamPort(t)) + "tls: {certFile: '" + pair.CertFile + "', keyFile: '" + pair.KeyFile + "'"
	if mutual {
		cfg += ", clientCAFile: '" + ca.File + "'"
	}
	cfg += "}\n"
	path := filepath.Join(dir, "tether.yaml")
	writeFile(t, path, cfg)
	return serveFor(t, path).serveInfo
}

// grpcHealth calls the ext_proc health service over TLS.
func grpcHealth(t *testing.T, addr string, cfg *tls.Config) error {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "envoy.service.ext_proc.v3.ExternalProcessor"})
	return err
}

// adsClusters opens an ADS stream over TLS and returns how many clusters the first CDS
// response holds.
func adsClusters(t *testing.T, addr string, cfg *tls.Config) (int, error) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return 0, err
	}
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "tls-envoy"}, TypeUrl: resourcev3.ClusterType}); err != nil {
		return 0, err
	}
	resp, err := stream.Recv()
	if err != nil {
		return 0, err
	}
	return len(resp.GetResources()), nil
}

// httpsStatus does one request over TLS and returns its status.
func httpsStatus(t *testing.T, method, url string, cfg *tls.Config) (int, error) {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}}
	defer client.CloseIdleConnections()
	req, err := http.NewRequest(method, url, strings.NewReader("INVITE sip:bob@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:5060;branch=z9hG4bK1\r\n"+
		"From: <sip:alice@example.com>;tag=1\r\nTo: <sip:bob@example.com>\r\nCall-ID: c1\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// TestEveryListenerServesTLS: with tls set, ext_proc (gRPC health), xDS (an ADS stream), the
// SIP decision endpoint and the API all complete TLS handshakes with tether's certificate and
// serve; none of them answers plain text.
func TestEveryListenerServesTLS(t *testing.T) {
	ca := servertlstest.NewCA(t, "tether")
	info := startTLSServe(t, ca, false)
	cfg := servertlstest.ClientConfig(ca, nil)
	if err := grpcHealth(t, info.extProcAddr, cfg); err != nil {
		t.Errorf("ext_proc health over TLS: %v", err)
	}
	if n, err := adsClusters(t, info.xdsAddr, cfg); err != nil || n != 1 {
		t.Errorf("ADS over TLS: %d clusters, %v; want 1", n, err)
	}
	// An empty body to an unknown service: the decision handler answers (400 for the missing
	// SIP request, or 404 for the service), which is what this test needs from TLS.
	if code, err := httpsStatus(t, http.MethodPost, "https://"+info.sipAddr+"/v1/sip/nosuch/decide", cfg); err != nil || code != http.StatusNotFound && code != http.StatusBadRequest {
		t.Errorf("SIP decide over TLS: %d, %v; want the handler's 400 or 404", code, err)
	}
	if code, err := httpsStatus(t, http.MethodGet, "https://"+info.apiAddr+"/v1/services/web/instances", cfg); err != nil || code != http.StatusOK {
		t.Errorf("API over TLS: %d, %v; want 200", code, err)
	}
	for name, addr := range map[string]string{"extProc": info.extProcAddr, "xds": info.xdsAddr, "sip": info.sipAddr, "api": info.apiAddr} {
		if plainTextAnswered(t, addr) {
			t.Errorf("%s answered a plain-text request", name)
		}
	}
}

// TestMutualTLSRefusesClientsWithoutCertificates: with tls.clientCAFile every listener
// refuses a client without a certificate and serves one with a certificate of that CA; the
// CLI does too.
func TestMutualTLSRefusesClientsWithoutCertificates(t *testing.T) {
	ca := servertlstest.NewCA(t, "tether")
	info := startTLSServe(t, ca, true)
	client := ca.Client(t, "envoy")
	with, without := servertlstest.ClientConfig(ca, &client), servertlstest.ClientConfig(ca, nil)
	if err := grpcHealth(t, info.extProcAddr, without); err == nil {
		t.Error("ext_proc served a client without a certificate")
	}
	if err := grpcHealth(t, info.extProcAddr, with); err != nil {
		t.Errorf("ext_proc with a client certificate: %v", err)
	}
	if _, err := adsClusters(t, info.xdsAddr, without); err == nil {
		t.Error("xDS served a client without a certificate")
	}
	if n, err := adsClusters(t, info.xdsAddr, with); err != nil || n != 1 {
		t.Errorf("xDS with a client certificate: %d, %v", n, err)
	}
	for name, url := range map[string]string{
		"sip": "https://" + info.sipAddr + "/v1/sip/nosuch/decide",
		"api": "https://" + info.apiAddr + "/v1/services/web/instances",
	} {
		if code, err := httpsStatus(t, http.MethodPost, url, without); err == nil {
			t.Errorf("%s served a client without a certificate (status %d)", name, code)
		}
		if _, err := httpsStatus(t, http.MethodPost, url, with); err != nil {
			t.Errorf("%s with a client certificate: %v", name, err)
		}
	}
	// The CLI reaches the API with -cacert, -cert and -key, and is refused without -cert.
	args := []string{"instances", "list", "-s", "web", "-addr", "https://" + info.apiAddr, "-cacert", ca.File}
	if code, out, errOut := runCmd(t, append(args, "-cert", client.CertFile, "-key", client.KeyFile)...); code != 0 || !strings.Contains(out, "i0") {
		t.Errorf("CLI with a client certificate: exit %d\n%s%s", code, out, errOut)
	}
	if code, _, _ := runCmd(t, args...); code == 0 {
		t.Error("CLI without a client certificate was served")
	}
}

// plainTextAnswered reports whether addr serves a plain-text HTTP request (net/http's TLS
// servers answer one with "400 Bad Request: client sent an HTTP request to an HTTPS server",
// which does not count).
func plainTextAnswered(t *testing.T, addr string) bool {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		return false
	}
	buf := make([]byte, 12)
	n, _ := io.ReadFull(conn, buf)
	return strings.HasPrefix(string(buf[:n]), "HTTP/") && !strings.HasSuffix(string(buf[:n]), " 400")
}

// TestPlainTextOffLoopbackIsRefusedOrWarned: a listener on every interface without tls is a
// config error, and with listeners.allowInsecure it starts with a warning naming it.
func TestPlainTextOffLoopbackIsRefusedOrWarned(t *testing.T) {
	dir := t.TempDir()
	base := "apiVersion: tether/v1\nregistry: {allowedNetworks: [127.0.0.1/32]}\nlisteners: {api: '', extProc: '0.0.0.0:0', xds: '', sip: ''"
	refused := filepath.Join(dir, "refused.yaml")
	writeFile(t, refused, base+"}\n")
	if err := serve(context.Background(), serveOptions{configPath: refused, logOut: io.Discard}); err == nil ||
		!strings.Contains(err.Error(), "listeners.extProc: 0.0.0.0:0 is not a loopback address") {
		t.Fatalf("serve = %v; want the plain-text listener refused", err)
	}
	allowed := filepath.Join(dir, "allowed.yaml")
	writeFile(t, allowed, base+", allowInsecure: true}\n")
	ctx, cancel := context.WithCancel(context.Background())
	var logs testutil.SyncBuffer
	done := make(chan error, 1)
	ready := make(chan serveInfo, 1)
	go func() {
		done <- serve(ctx, serveOptions{configPath: allowed, logOut: &logs, reload: make(chan os.Signal),
			ready: func(i serveInfo) { ready <- i }})
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("serve: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "listener=extProc") ||
		!strings.Contains(logs.String(), "serves plain text") {
		t.Errorf("no warning for the plain-text listener:\n%s", logs.String())
	}
}

// TestServeRotatesCertificatesWithoutRestart replaces the certificate files of a running
// serve: new handshakes get the new certificate (checked at most once a second), with no
// restart and no reload signal.
func TestServeRotatesCertificatesWithoutRestart(t *testing.T) {
	ca := servertlstest.NewCA(t, "tether")
	first, second := ca.Server(t, "first"), ca.Server(t, "second")
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	servertlstest.Install(t, first, certFile, keyFile)
	path := filepath.Join(dir, "tether.yaml")
	writeFile(t, path, testConfig(upstreamPort(t))+"tls: {certFile: tls.crt, keyFile: tls.key}\n")
	info := serveFor(t, path).serveInfo // serve's own error is checked when the test ends
	serial := func() string {
		conn, err := tls.Dial("tcp", info.extProcAddr, servertlstest.ClientConfig(ca, nil, "h2"))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = conn.Close() }()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	if got := serial(); got != first.TLS.Leaf.SerialNumber.String() {
		t.Fatalf("serving serial %s, want the first certificate's", got)
	}
	servertlstest.Install(t, second, certFile, keyFile)
	waitFor(t, "the rotated certificate served", func() bool { return serial() == second.TLS.Leaf.SerialNumber.String() })
}
