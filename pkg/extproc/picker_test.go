package extproc_test

import (
	"context"
	"net"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/extproc"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/servertls"
	"github.com/tether-dev/tether/pkg/servertls/servertlstest"
	"github.com/tether-dev/tether/pkg/wire"
)

// TestEndpointPickerMode: tether attached as a Gateway API Inference Extension endpoint
// picker — dialled over TLS (a test CA; servertls serves the certificate), streams carrying no
// x-tether-service (the listener's default service stands for the pool), the data plane's
// subset hint honoured (the pick stays inside it; 503 when nothing in it can serve), the
// served endpoint read back and mismatches counted, and the liveness and readiness health
// services answering.
func TestEndpointPickerMode(t *testing.T) {
	svc := affinitytest.Service("pool", registry.AffinityHeader)
	svc.Match = registry.Match{Authorities: []string{"tether.internal"}, PathPrefix: "/"} // the gateway's :authority never matches
	insts := affinitytest.Instances("pool", 3)
	f := affinitytest.New(t, []registry.Service{svc}, insts)
	srv := extproc.NewServer(f.Engine, extproc.WithDefaultService("pool"))

	ca := servertlstest.NewCA(t, "picker")
	cert := ca.Server(t, "tether")
	src, err := servertls.New(servertls.Files{CertFile: cert.CertFile, KeyFile: cert.KeyFile})
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(append(extproc.ServerOptions(), grpc.Creds(credentials.NewTLS(src.Config("h2"))))...)
	extproc.Register(gs, srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(servertlstest.ClientConfig(ca, nil))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	client := extprocv3.NewExternalProcessorClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// Health services, over TLS.
	hc := healthpb.NewHealthClient(conn)
	for _, name := range []string{wire.LivenessService, wire.ReadinessService, wire.ExtProcServiceName} {
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: name})
		if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health %q: %v %v, want SERVING", name, r.GetStatus(), err)
		}
	}

	withSubset := func(req *extprocv3.ProcessingRequest, subset ...string) *extprocv3.ProcessingRequest {
		vals := make([]*structpb.Value, len(subset))
		for i, s := range subset {
			vals[i] = structpb.NewStringValue(s)
		}
		req.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			wire.SubsetHintNamespace: {Fields: map[string]*structpb.Value{
				wire.SubsetHintKey: structpb.NewListValue(&structpb.ListValue{Values: vals}),
			}},
		}}
		return req
	}
	open := func() extprocv3.ExternalProcessor_ProcessClient {
		st, err := client.Process(ctx) // no x-tether-service: the default service
		if err != nil {
			t.Fatal(err)
		}
		return st
	}

	// The subset names the third instance only: the new session goes there, whatever the
	// placement rule would have chosen (the first).
	third := insts[2].HTTPAddr()
	st := open()
	r := roundTrip(t, st, withSubset(reqHeaders("POST", "/v1/completions", false), third))
	if got := destination(r); got != third {
		t.Fatalf("destination %q, want %s from the subset (response %v)", got, third, r)
	}
	// The data plane reports it served another endpoint: counted.
	resp := roundTrip(t, st, respHeaders("200", insts[0].HTTPAddr(), false))
	id, _, _ := setHeader(resp.GetResponseHeaders().GetResponse().GetHeaderMutation(), "x-tether-session")
	closeAndWait(t, st)
	if s := srv.Stats(); s.ServedHostMismatches != 1 || s.Decisions != 1 {
		t.Errorf("stats %+v: want 1 decision and the served-endpoint mismatch counted", s)
	}

	// The session's follow-up with a subset that no longer lists its instance moves into it.
	st = open()
	second := insts[1].HTTPAddr()
	if got := destination(roundTrip(t, st, withSubset(reqHeaders("POST", "/v1/completions", false, "x-tether-session", id), second))); got != second {
		t.Errorf("follow-up with subset [%s]: destination %q", second, got)
	}
	roundTrip(t, st, respHeaders("200", second, false))
	closeAndWait(t, st)

	// Nothing in the subset can serve: 503.
	st = open()
	imm := roundTrip(t, st, withSubset(reqHeaders("POST", "/v1/completions", false), "192.0.2.9:8000")).GetImmediateResponse()
	if imm.GetStatus().GetCode() != 503 {
		t.Errorf("subset without eligible instance: %v, want ImmediateResponse 503", imm)
	}
	if s := srv.Stats(); s.ServedHostMismatches != 1 || s.Rejects.NoCapacity != 1 {
		t.Errorf("stats %+v: want 1 mismatch and 1 no-capacity rejection", s)
	}

	// Draining: readiness goes NOT_SERVING, liveness stays SERVING.
	srv.Drain()
	for name, want := range map[string]healthpb.HealthCheckResponse_ServingStatus{
		wire.LivenessService: healthpb.HealthCheckResponse_SERVING, wire.ReadinessService: healthpb.HealthCheckResponse_NOT_SERVING,
	} {
		if r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: name}); err != nil || r.GetStatus() != want {
			t.Errorf("health %q while draining: %v %v, want %v", name, r.GetStatus(), err, want)
		}
	}
}
