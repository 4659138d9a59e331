// Package servertls gives tether's listeners TLS from certificate files: the certificate, its
// key and an optional client CA (mutual TLS) are read at start and read again when the files
// change, so a rotated certificate (cert-manager, a Kubernetes secret's symlink swap, a
// renewed file written in place) is served from the next handshake on without a restart.
//
// A Source is safe for concurrent use. It starts no goroutine: a handshake checks the files
// at most once per check interval (os.Stat of each; the files are read only when one
// changed). A change that does not load — a half-written rotation, a key that does not match
// its certificate, a CA file without a certificate — keeps the previous material serving,
// is logged once, and is tried again when the files change again.
package servertls

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"
)

// Files names the PEM files of a TLS listener. CertFile and KeyFile are required; CertFile may
// hold the chain after the leaf. ClientCAFile, if set, turns on mutual TLS: every client must
// present a certificate that chains to one of its certificates.
type Files struct {
	CertFile     string
	KeyFile      string
	ClientCAFile string
}

// DefaultCheckInterval is how often, at most, a handshake looks at the files.
const DefaultCheckInterval = time.Second

// Option configures a Source.
type Option func(*Source)

// WithLogger sets the logger for reloads and failed reloads (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(s *Source) { s.log = l } }

// WithCheckInterval sets how often, at most, the files are checked for changes (default
// DefaultCheckInterval; 0 checks on every handshake).
func WithCheckInterval(d time.Duration) Option { return func(s *Source) { s.interval = d } }

// WithClock sets the clock used for the check interval (default time.Now).
func WithClock(now func() time.Time) Option { return func(s *Source) { s.now = now } }

// Source holds the current certificate and client CA pool of one listener.
type Source struct {
	files    Files
	log      *slog.Logger
	interval time.Duration
	now      func() time.Time

	mu        sync.Mutex
	cur       *material
	lastCheck time.Time
	seen      [3]os.FileInfo // of the files as last loaded or last failed
}

// material is one loaded generation; immutable once built.
type material struct {
	cert     *tls.Certificate
	clientCA *x509.CertPool
	notAfter time.Time
}

// New reads the files and returns a Source serving them. It fails if they do not load.
func New(files Files, opts ...Option) (*Source, error) {
	if files.CertFile == "" || files.KeyFile == "" {
		return nil, errors.New("servertls: a certificate file and a key file are required")
	}
	s := &Source{files: files, log: slog.Default(), interval: DefaultCheckInterval, now: time.Now}
	for _, o := range opts {
		o(s)
	}
	seen, err := s.stat()
	if err != nil {
		return nil, err
	}
	m, err := s.load()
	if err != nil {
		return nil, err
	}
	s.cur, s.seen, s.lastCheck = m, seen, s.now()
	return s, nil
}

// MutualTLS reports whether clients must present a verified certificate.
func (s *Source) MutualTLS() bool { return s.files.ClientCAFile != "" }

// Config returns a server tls.Config that serves the Source's current material; nextProtos
// are the ALPN protocols offered ("h2" for gRPC, "h2", "http/1.1" for HTTP). TLS 1.2 is the
// minimum. The returned Config may be shared by any number of listeners.
func (s *Source) Config(nextProtos ...string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: nextProtos,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			m := s.current()
			c := &tls.Config{
				MinVersion:   tls.VersionTLS12,
				NextProtos:   nextProtos,
				Certificates: []tls.Certificate{*m.cert},
			}
			if m.clientCA != nil {
				c.ClientAuth = tls.RequireAndVerifyClientCert
				c.ClientCAs = m.clientCA
			}
			return c, nil
		},
	}
}

// Listener wraps l so that every accepted connection is served TLS with Config(nextProtos...).
// The handshake runs on the connection's first read or write, under the deadlines the server
// sets on it.
func (s *Source) Listener(l net.Listener, nextProtos ...string) net.Listener {
	return tls.NewListener(l, s.Config(nextProtos...))
}

// current returns the material to serve, reloading first if the check interval has passed
// and a file changed.
func (s *Source) current() *material {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if now.Sub(s.lastCheck) < s.interval {
		return s.cur
	}
	s.lastCheck = now
	seen, err := s.stat()
	if err != nil {
		if !sameFiles(seen, s.seen) {
			s.seen = seen
			s.log.Warn("TLS files unreadable; still serving the previous certificate", "cert", s.files.CertFile, "err", err)
		}
		return s.cur
	}
	if sameFiles(seen, s.seen) {
		return s.cur
	}
	s.seen = seen
	m, err := s.load()
	if err != nil {
		s.log.Warn("TLS files changed but do not load; still serving the previous certificate",
			"cert", s.files.CertFile, "err", err)
		return s.cur
	}
	s.cur = m
	s.log.Info("TLS certificate reloaded", "cert", s.files.CertFile, "notAfter", m.notAfter)
	return m
}

// Reload reads the files now, whether or not they changed, and serves them if they load.
func (s *Source) Reload() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	seen, err := s.stat()
	if err != nil {
		return err
	}
	m, err := s.load()
	if err != nil {
		return err
	}
	s.cur, s.seen, s.lastCheck = m, seen, s.now()
	return nil
}

// NotAfter is the expiry of the certificate being served.
func (s *Source) NotAfter() time.Time { return s.current().notAfter }

func (s *Source) paths() [3]string {
	return [3]string{s.files.CertFile, s.files.KeyFile, s.files.ClientCAFile}
}

// stat returns the FileInfo of each file (nil for an unset ClientCAFile). On error the
// infos read so far are returned too, so a repeated failure is logged once.
func (s *Source) stat() ([3]os.FileInfo, error) {
	var out [3]os.FileInfo
	for i, p := range s.paths() {
		if p == "" {
			continue
		}
		fi, err := os.Stat(p)
		if err != nil {
			return out, fmt.Errorf("servertls: %w", err)
		}
		out[i] = fi
	}
	return out, nil
}

// sameFiles reports whether every file is unchanged: the same file (device and inode, so a
// symlink swap counts as a change), size and modification time.
func sameFiles(a, b [3]os.FileInfo) bool {
	for i := range a {
		switch {
		case a[i] == nil && b[i] == nil:
		case a[i] == nil || b[i] == nil:
			return false
		case !os.SameFile(a[i], b[i]) || a[i].Size() != b[i].Size() || !a[i].ModTime().Equal(b[i].ModTime()):
			return false
		}
	}
	return true
}

func (s *Source) load() (*material, error) {
	cert, err := tls.LoadX509KeyPair(s.files.CertFile, s.files.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("servertls: %s, %s: %w", s.files.CertFile, s.files.KeyFile, err)
	}
	m := &material{cert: &cert, notAfter: cert.Leaf.NotAfter}
	if s.files.ClientCAFile != "" {
		pem, err := os.ReadFile(s.files.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("servertls: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("servertls: %s: no PEM certificate in the client CA file: %w", s.files.ClientCAFile, fs.ErrInvalid)
		}
		m.clientCA = pool
	}
	return m, nil
}
