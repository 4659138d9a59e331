package servertls_test

import (
	"crypto/tls"
	"path/filepath"
	"testing"

	"github.com/tether-dev/tether/pkg/servertls"
	"github.com/tether-dev/tether/pkg/servertls/servertlstest"
)

// ClientConfig trusts the CA file, checks the server name, and presents the client pair read at
// each handshake: a rotated pair is used by the next connection.
func TestClientConfig(t *testing.T) {
	ca := servertlstest.NewCA(t, "ca")
	srv := ca.Server(t, "srv", "srv.example")
	first, second := ca.Client(t, "first"), ca.Client(t, "second")
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "c.pem"), filepath.Join(dir, "c-key.pem")
	servertlstest.Install(t, first, certFile, keyFile)

	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{srv.TLS}, ClientCAs: ca.Pool(),
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	peers := make(chan string, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tc := c.(*tls.Conn)
			if tc.Handshake() == nil {
				peers <- tc.ConnectionState().PeerCertificates[0].Subject.CommonName
			} else {
				peers <- ""
			}
			_ = c.Close()
		}
	}()
	dial := func(serverName string) (string, error) {
		cfg, err := servertls.ClientConfig(servertls.ClientFiles{CAFile: ca.File, CertFile: certFile, KeyFile: keyFile, ServerName: serverName})
		if err != nil {
			t.Fatal(err)
		}
		c, err := tls.Dial("tcp", ln.Addr().String(), cfg)
		if err != nil {
			return "", err
		}
		defer func() { _ = c.Close() }()
		return <-peers, nil
	}
	if cn, err := dial("srv.example"); err != nil || cn != "first" {
		t.Fatalf("first connection: peer %q, %v; want the first client certificate", cn, err)
	}
	servertlstest.Install(t, second, certFile, keyFile)
	if cn, err := dial("srv.example"); err != nil || cn != "second" {
		t.Fatalf("after rotation: peer %q, %v; want the second client certificate", cn, err)
	}
	if _, err := dial("other.example"); err == nil {
		t.Error("a server certificate without the server name was accepted")
	}
	if _, err := servertls.ClientConfig(servertls.ClientFiles{CertFile: certFile}); err == nil {
		t.Error("a certificate without its key was accepted")
	}
}
