package extproc_test

import (
	"context"
	"fmt"
	"io"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/extproc"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/wire"
)

// memStream is an in-memory ext_proc server stream: Recv returns the queued messages, then
// io.EOF (Envoy's half-close). It is the transport only; the server and engine are real.
type memStream struct {
	extprocv3.ExternalProcessor_ProcessServer // unimplemented methods panic
	ctx                                       context.Context
	in                                        []*extprocv3.ProcessingRequest
	out                                       []*extprocv3.ProcessingResponse
}

func (s *memStream) Context() context.Context { return s.ctx }
func (s *memStream) Recv() (*extprocv3.ProcessingRequest, error) {
	if len(s.in) == 0 {
		return nil, io.EOF
	}
	r := s.in[0]
	s.in = s.in[1:]
	return r, nil
}

func (s *memStream) Send(r *extprocv3.ProcessingResponse) error {
	s.out = append(s.out, r)
	return nil
}

// SendMsg takes what the server pre-encodes (a type embedding the response) as well as a
// plain response.
func (s *memStream) SendMsg(m any) error {
	if pm, ok := m.(interface{ ProtoReflect() protoreflect.Message }); ok {
		if r, ok := pm.ProtoReflect().Interface().(*extprocv3.ProcessingResponse); ok {
			s.out = append(s.out, r)
			return nil
		}
	}
	return fmt.Errorf("memStream: cannot send %T", m)
}

func (s *memStream) SetHeader(metadata.MD) error  { return nil }
func (s *memStream) SendHeader(metadata.MD) error { return nil }
func (s *memStream) SetTrailer(metadata.MD)       {}

// fuzzMessages turns fuzz input into an ext_proc message sequence: each op byte picks a
// message kind, and the strings fill header values (cookie, session header, MCP session id,
// path, served host, body).
func fuzzMessages(ops []byte, a, b string) []*extprocv3.ProcessingRequest {
	var out []*extprocv3.ProcessingRequest
	for i, op := range ops {
		eos := op&0x80 != 0
		switch op % 9 {
		case 0:
			out = append(out, reqHeaders("GET", "/"+a, eos))
		case 1:
			out = append(out, reqHeaders("POST", "/mcp", eos, "cookie", "tether-session="+a, "x-tether-session", b))
		case 2:
			out = append(out, reqHeaders("POST", "/mcp", eos, "mcp-session-id", a, "accept", "text/event-stream"))
		case 3:
			out = append(out, respHeaders("200", b, eos, "content-type", "text/event-stream", "mcp-session-id", a))
		case 4:
			out = append(out, respHeaders([]string{"200", "404", "503", a}[i%4], "127.0.0.1:8001", eos, "set-cookie", b))
		case 5:
			out = append(out, respBody("event: endpoint\ndata: /m?sessionId="+a+"\n\n", eos))
		case 6:
			out = append(out, respBody(b, eos))
		case 7:
			out = append(out, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
				RequestBody: &extprocv3.HttpBody{Body: []byte(a), EndOfStream: eos}}})
		case 8:
			out = append(out, &extprocv3.ProcessingRequest{
				Request:         &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}},
				MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"envoy.lb": {}}},
			})
		}
	}
	return out
}

// FuzzProcessSequence plays arbitrary ext_proc message sequences (any order, repeats, hostile
// header values) on streams of each affinity mode against a real engine; whatever the
// sequence, Process returns, it answers each message of the sequence at most once, in order
// and in the message's own phase (an ImmediateResponse, in place of any answer, is the last),
// and once every stream has ended no request slot is in flight.
func FuzzProcessSequence(f *testing.F) {
	f.Add([]byte{0, 3, 8}, "x", "127.0.0.1:8001", uint8(0))
	f.Add([]byte{1, 4, 6}, "0123456789abcdef0123456789abcdef", "JSESSIONID=a; Path=/", uint8(1))
	f.Add([]byte{2, 3, 5, 5, 6 | 0x80}, "sess-1", "127.0.0.1:8002", uint8(2))
	f.Add([]byte{0, 0, 1, 2}, "", "", uint8(3))
	f.Add([]byte{7, 7, 0x80}, "\x00\xff;=,", "\r\n", uint8(4))
	modes := []registry.AffinityMode{registry.AffinityNone, registry.AffinityCookie, registry.AffinityHeader,
		registry.AffinityMCPStreamable, registry.AffinityMCPSSE}
	var svcs []registry.Service
	var insts []registry.Instance
	for _, m := range modes {
		name := "s-" + string(m)
		svc := affinitytest.Service(name, m)
		if m == registry.AffinityMCPStreamable || m == registry.AffinityMCPSSE {
			svc.Match.PathPrefix = "/"
		}
		svcs = append(svcs, svc)
		insts = append(insts, affinitytest.Instances(name, 2)...)
	}
	fx := affinitytest.New(f, svcs, insts)
	srv := extproc.NewServer(fx.Engine)
	f.Fuzz(func(t *testing.T, ops []byte, a, b string, mode uint8) {
		if len(ops) > 64 {
			ops = ops[:64]
		}
		service := svcs[int(mode)%len(svcs)].Name
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(wire.ServiceMetadataKey, service))
		// Two streams interleaved would need goroutines; run the sequence, then a second one
		// that reuses whatever session the first created.
		for range 2 {
			in := fuzzMessages(ops, a, b)
			st := &memStream{ctx: ctx, in: in}
			_ = srv.Process(st)
			checkPhases(t, in, st.out)
		}
		for _, s := range svcs {
			if n := requestsInFlight(t, fx, s.Name); n != 0 {
				t.Fatalf("%d requests in flight on %s after every stream ended", n, s.Name)
			}
		}
	})
}

// phase names the processing phase of a request or response message.
func phase(m protoreflect.ProtoMessage) string {
	od := m.ProtoReflect().Descriptor().Oneofs().ByName("request")
	if od == nil {
		od = m.ProtoReflect().Descriptor().Oneofs().ByName("response")
	}
	if f := m.ProtoReflect().WhichOneof(od); f != nil {
		return string(f.Name())
	}
	return ""
}

// checkPhases: the responses answer a subsequence of the requests, in order, each in its
// request's phase, except an ImmediateResponse, which may answer any message and is last.
func checkPhases(t *testing.T, in []*extprocv3.ProcessingRequest, out []*extprocv3.ProcessingResponse) {
	t.Helper()
	j := 0
	for i, r := range out {
		p := phase(r)
		if p == "immediate_response" {
			if i != len(out)-1 {
				t.Fatalf("response %d of %d is an ImmediateResponse, yet more followed", i+1, len(out))
			}
			return
		}
		for j < len(in) && phase(in[j]) != p {
			j++
		}
		if j == len(in) {
			t.Fatalf("response %d (%s) answers no remaining request; requests %v", i+1, p, phases(in))
		}
		j++
	}
}

func phases(in []*extprocv3.ProcessingRequest) []string {
	var out []string
	for _, m := range in {
		out = append(out, phase(m))
	}
	return out
}
