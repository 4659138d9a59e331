package extproc

import (
	"context"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session/memstore"
)

// ctxStream is the part of a ProcessServer the handlers use: its context.
type ctxStream struct {
	extprocv3.ExternalProcessor_ProcessServer
	ctx context.Context
}

func (s ctxStream) Context() context.Context { return s.ctx }

// BenchmarkHandleExistingSession measures tether's own work per exchange (request_headers,
// response_headers, end), without gRPC: the server-side cost the round-trip benchmark adds to
// the null processor's.
func BenchmarkHandleExistingSession(b *testing.B) {
	svc := affinitytest.Service("web", registry.AffinityCookie)
	svc.RequestSlotsPerInstance = 10000
	f := affinitytest.New(b, []registry.Service{svc}, affinitytest.Instances("web", 4),
		affinitytest.WithEngineOptions(affinity.WithSweepInterval(time.Second)),
		affinitytest.WithStoreOptions(memstore.WithReapInterval(time.Second)))
	s := NewServer(f.Engine)
	st := ctxStream{ctx: metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-tether-service", "web"))}
	hdr := func(kv ...string) *corev3.HeaderMap {
		m := &corev3.HeaderMap{}
		for i := 0; i+1 < len(kv); i += 2 {
			m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
		}
		return m
	}
	attrs := map[string]*structpb.Struct{attributesKey: {Fields: map[string]*structpb.Value{
		"source.address": structpb.NewStringValue("192.0.2.7:40001"), "source.port": structpb.NewNumberValue(40001),
		"request.id": structpb.NewStringValue("req-1")}}}
	first := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: hdr(":authority", "app.example", ":path", "/", ":method", "GET", ":scheme", "http"), EndOfStream: true}}, Attributes: attrs}
	ex := exchange{srv: s}
	_, _, _ = ex.handle(context.Background(), st, first)
	rh := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: hdr(":status", "200", "content-type", "text/plain")}}}
	r, _, _ := ex.handle(context.Background(), st, rh)
	v, _, _ := strings.Cut(string(r.GetResponseHeaders().GetResponse().GetHeaderMutation().GetSetHeaders()[0].GetHeader().GetRawValue()), ";")
	ex.end()
	req := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: hdr(":authority", "app.example", ":path", "/", ":method", "GET", ":scheme", "http",
			"user-agent", "bench", "accept", "*/*", "cookie", v, "x-forwarded-proto", "http", "x-request-id", "req-1"),
		EndOfStream: true}}, Attributes: attrs}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		ex := exchange{srv: s}
		if _, _, err := ex.handle(context.Background(), st, req); err != nil {
			b.Fatal(err)
		}
		if _, _, err := ex.handle(context.Background(), st, rh); err != nil {
			b.Fatal(err)
		}
		ex.end()
	}
}
