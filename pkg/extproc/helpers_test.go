package extproc_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/extproc"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/wire"
)

// env is a real engine (registry + memstore.Store) behind a real ext_proc gRPC server on
// loopback, and a client that plays Envoy's part message by message.
type env struct {
	f       *affinitytest.Fixture
	srv     *extproc.Server
	counter *countingEngine
	client  extprocv3.ExternalProcessorClient
	conn    *grpc.ClientConn
	gs      *grpc.Server
}

func newEnv(t *testing.T, services []registry.Service, instances []registry.Instance, opts ...extproc.Option) *env {
	t.Helper()
	f := affinitytest.New(t, services, instances)
	return newEnvWith(t, f, f.Engine, opts...)
}

func newEnvWith(t *testing.T, f *affinitytest.Fixture, eng extproc.Engine, opts ...extproc.Option) *env {
	t.Helper()
	// tether's options: pre-encoded answers and the first-message tap included
	return newEnvOn(t, f, eng, extproc.ServerOptions(), opts...)
}

// newEnvOn is newEnvWith on a gRPC server with the given options.
func newEnvOn(t *testing.T, f *affinitytest.Fixture, eng extproc.Engine, grpcOpts []grpc.ServerOption, opts ...extproc.Option) *env {
	t.Helper()
	ce := &countingEngine{inner: eng}
	srv := extproc.NewServer(ce, opts...)
	gs := grpc.NewServer(grpcOpts...)
	extproc.Register(gs, srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		gs.Stop()
	})
	return &env{f: f, srv: srv, counter: ce, client: extprocv3.NewExternalProcessorClient(conn), conn: conn, gs: gs}
}

// open starts an ext_proc stream, naming the service in initial metadata when service != "",
// with the further initial metadata kv (key, value, ...).
func (e *env) open(t *testing.T, service string, kv ...string) (extprocv3.ExternalProcessor_ProcessClient, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	if service != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, wire.ServiceMetadataKey, service)
	}
	if len(kv) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, kv...)
	}
	st, err := e.client.Process(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(cancel)
	return st, cancel
}

// roundTrip sends one message and returns the answer.
func roundTrip(t *testing.T, st extprocv3.ExternalProcessor_ProcessClient, req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	t.Helper()
	if err := st.Send(req); err != nil {
		t.Fatalf("send: %v", err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatalf("recv: %v", err)
	}
	return resp
}

// closeAndWait half-closes the stream and waits for the server to finish it.
func closeAndWait(t *testing.T, st extprocv3.ExternalProcessor_ProcessClient) {
	t.Helper()
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after CloseSend: got %v, want io.EOF", err)
	}
}

func headerMap(kv ...string) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return m
}

// reqHeaders builds a request_headers message as Envoy sends it (raw values, attributes).
func reqHeaders(method, path string, eos bool, kv ...string) *extprocv3.ProcessingRequest {
	all := append([]string{":authority", "app.example", ":path", path, ":method", method, ":scheme", "http"}, kv...)
	return &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: headerMap(all...), EndOfStream: eos,
		}},
		MetadataContext: &corev3.Metadata{},
		Attributes: map[string]*structpb.Struct{"envoy.filters.http.ext_proc": {Fields: map[string]*structpb.Value{
			"source.address": structpb.NewStringValue("192.0.2.7:40001"),
			"source.port":    structpb.NewNumberValue(40001),
			"request.id":     structpb.NewStringValue("req-1"),
		}}},
	}
}

// respHeaders builds a response_headers message with the served host in metadata_context.
func respHeaders(status, served string, eos bool, kv ...string) *extprocv3.ProcessingRequest {
	md := &corev3.Metadata{}
	if served != "" {
		md.FilterMetadata = map[string]*structpb.Struct{"envoy.lb": {Fields: map[string]*structpb.Value{
			"x-gateway-destination-endpoint-served": structpb.NewStringValue(served),
		}}}
	}
	return &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: headerMap(append([]string{":status", status}, kv...)...), EndOfStream: eos,
		}},
		MetadataContext: md,
	}
}

func respBody(b string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: []byte(b), EndOfStream: eos},
	}}
}

// destination returns the destination header the answer sets, or "".
func destination(resp *extprocv3.ProcessingResponse) string {
	for _, h := range resp.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == wire.DestinationHeader {
			return string(h.GetHeader().GetRawValue())
		}
	}
	return ""
}

// Header mutation meanings, as every reader (Envoy, gRFC A93) agrees on them.
const (
	actionAppend    = "append"    // append_action APPEND_IF_EXISTS_OR_ADD with the legacy append true
	actionOverwrite = "overwrite" // append_action OVERWRITE_IF_EXISTS_OR_ADD, legacy append unset
)

// setHeader returns the value (raw_value; value must be empty) and the meaning of the first
// set_headers entry named name: actionAppend, actionOverwrite, or a description of a
// combination whose meaning depends on the reader.
func setHeader(m *extprocv3.HeaderMutation, name string) (string, string, bool) {
	for _, h := range m.GetSetHeaders() {
		if h.GetHeader().GetKey() != name {
			continue
		}
		v := string(h.GetHeader().GetRawValue())
		if h.GetHeader().GetValue() != "" {
			return v, "value set besides raw_value", true
		}
		legacy := h.GetAppend() //nolint:staticcheck // checking the legacy field tether sets for Envoy
		switch {
		case h.GetAppendAction() == corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD && legacy.GetValue():
			return v, actionAppend, true
		case h.GetAppendAction() == corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD && legacy == nil:
			return v, actionOverwrite, true
		}
		return v, fmt.Sprintf("ambiguous (append_action %v, append %v)", h.GetAppendAction(), legacy), true
	}
	return "", "", false
}

// countingEngine wraps the real engine and counts End calls (and successful HandOffs) per
// decision, to prove each decision is ended exactly once.
type countingEngine struct {
	inner   extproc.Engine
	mu      sync.Mutex
	all     []*countingDecision
	decided atomic.Int64
}

func (c *countingEngine) Decide(ctx context.Context, req affinity.Request) (affinity.Decision, error) {
	d, err := c.inner.Decide(ctx, req)
	if err != nil {
		return nil, err
	}
	cd := &countingDecision{Decision: d}
	c.mu.Lock()
	c.all = append(c.all, cd)
	c.mu.Unlock()
	c.decided.Add(1)
	return cd, nil
}

// ends returns how many decisions were made and the End count of each.
func (c *countingEngine) ends() []int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]int32, len(c.all))
	for i, d := range c.all {
		out[i] = d.ends.Load()
	}
	return out
}

// waitAllEnded waits until every decision made so far was ended, then checks none was
// ended twice.
func (c *countingEngine) waitAllEnded(t *testing.T) {
	t.Helper()
	testutil.Eventually(t, "every decision ended", func() bool {
		for _, n := range c.ends() {
			if n == 0 {
				return false
			}
		}
		return true
	})
	for i, n := range c.ends() {
		if n != 1 {
			t.Errorf("decision %d ended %d times, want exactly 1", i, n)
		}
	}
}

type countingDecision struct {
	affinity.Decision
	ends atomic.Int32
}

func (d *countingDecision) End() {
	d.ends.Add(1)
	d.Decision.End()
}

// HandOff counts as an end when it succeeds (it ends the decision).
func (d *countingDecision) HandOff(ctx context.Context) error {
	err := d.Decision.HandOff(ctx)
	if err == nil {
		d.ends.Add(1)
	}
	return err
}

// requestsInFlight sums the request slots in use over a service's instances.
func requestsInFlight(t *testing.T, f *affinitytest.Fixture, service string) int {
	t.Helper()
	n := 0
	for _, u := range f.Usage(t, service) {
		n += u[1]
	}
	return n
}
