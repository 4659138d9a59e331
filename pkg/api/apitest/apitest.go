// Package apitest runs a real tether API server for tests: a registry, session store and
// affinity engine (affinitytest's fixture, with a settable clock) behind api.Server's handler on
// a real loopback listener that speaks HTTP/1.1 and unencrypted HTTP/2 (gRPC).
package apitest

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/api"
	"github.com/tether-dev/tether/pkg/config"
	"github.com/tether-dev/tether/pkg/registry"
)

// Server is a running API server.
type Server struct {
	*affinitytest.Fixture
	// Addr is the listener's host:port on 127.0.0.1.
	Addr string
	// URL is "http://" + Addr.
	URL string
}

type options struct {
	auth    config.Auth
	fixture []affinitytest.Option
	api     []api.Option
}

// Option configures Start.
type Option func(*options)

// WithAuth sets the server's bearer tokens.
func WithAuth(a config.Auth) Option { return func(o *options) { o.auth = a } }

// WithFixtureOptions passes options to affinitytest.New.
func WithFixtureOptions(f ...affinitytest.Option) Option {
	return func(o *options) { o.fixture = append(o.fixture, f...) }
}

// WithAPIOptions passes more options to api.NewServer.
func WithAPIOptions(a ...api.Option) Option { return func(o *options) { o.api = append(o.api, a...) } }

// Start builds the fixture over services and instances and serves the API on 127.0.0.1:0
// until the test ends.
func Start(t testing.TB, services []registry.Service, instances []registry.Instance, opts ...Option) *Server {
	t.Helper()
	var o options
	for _, f := range opts {
		f(&o)
	}
	return Serve(t, affinitytest.New(t, services, instances, o.fixture...), opts...)
}

// Serve serves the API over an existing fixture (e.g. the one an end-to-end environment runs
// its data plane on) on 127.0.0.1:0 until the test ends. Fixture options are ignored.
func Serve(t testing.TB, fx *affinitytest.Fixture, opts ...Option) *Server {
	t.Helper()
	var o options
	for _, f := range opts {
		f(&o)
	}
	srv := api.NewServer(fx.Registry, append([]api.Option{api.WithEngine(fx.Engine), api.WithAuth(o.auth)}, o.api...)...)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("apitest: listen: %v", err)
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	api.EnableH2C(hs)
	done := make(chan error, 1)
	go func() { done <- hs.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("apitest: serve: %v", err)
		}
	})
	return &Server{Fixture: fx, Addr: ln.Addr().String(), URL: "http://" + ln.Addr().String()}
}

// Dial returns a gRPC client connection to the server with insecure credentials (h2c), closed
// when the test ends.
func (s *Server) Dial(t testing.TB, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(s.Addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatalf("apitest: dial: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}
