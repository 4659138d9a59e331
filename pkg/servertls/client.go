package servertls

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// ClientFiles names the PEM files of a TLS client (tether dialing a server: a mesh's xDS
// control plane, say). CAFile is the bundle that signs the server's certificate ("" trusts the
// system roots); CertFile and KeyFile, both or neither, are the client certificate for mutual
// TLS; ServerName is the name checked in the server's certificate and sent as SNI ("" uses the
// host dialed).
type ClientFiles struct {
	CAFile, CertFile, KeyFile, ServerName string
}

// ClientConfig returns a client tls.Config (TLS 1.2 or later) for files. The CA bundle is read
// now; the client certificate is read on every handshake, so a rotated pair is used by the
// next connection without a restart (a pair that no longer loads fails that handshake).
func ClientConfig(files ClientFiles) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: files.ServerName}
	if files.CAFile != "" {
		pem, err := os.ReadFile(files.CAFile)
		if err != nil {
			return nil, fmt.Errorf("tls: CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls: CA %s: no PEM certificate", files.CAFile)
		}
		c.RootCAs = pool
	}
	switch {
	case files.CertFile == "" && files.KeyFile == "":
	case files.CertFile == "" || files.KeyFile == "":
		return nil, errors.New("tls: a client certificate needs both certFile and keyFile")
	default:
		if _, err := tls.LoadX509KeyPair(files.CertFile, files.KeyFile); err != nil {
			return nil, fmt.Errorf("tls: client certificate: %w", err)
		}
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			pair, err := tls.LoadX509KeyPair(files.CertFile, files.KeyFile)
			if err != nil {
				return nil, fmt.Errorf("tls: client certificate: %w", err)
			}
			return &pair, nil
		}
	}
	return c, nil
}
