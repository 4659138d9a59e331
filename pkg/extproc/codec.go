package extproc

import (
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	protobuf "google.golang.org/protobuf/proto"
)

// preEncoded is a shared answer (the request_headers route answer of one address, or a plain
// CONTINUE) together with its wire encoding, made once. It is still the proto message
// (embedded), so a server without the codec of ServerOptions marshals it as usual; with it,
// sending costs no marshalling (the route answer's Struct metadata is the most expensive part to encode).
type preEncoded struct {
	*extprocv3.ProcessingResponse
	wire []byte
	addr string // the endpoint (ip:port) a route answer sends requests to
}

func newPreEncoded(r *extprocv3.ProcessingResponse, addr string) *preEncoded {
	b, err := protobuf.MarshalOptions{Deterministic: true}.Marshal(r)
	if err != nil {
		b = nil // cannot happen for the messages built here; the codec then marshals r
	}
	return &preEncoded{ProcessingResponse: r, wire: b, addr: addr}
}

// codec is gRPC's proto codec, except that a *preEncoded message is sent as its encoding.
// Nothing retains or modifies the bytes: mem.SliceBuffer's Free does nothing.
type codec struct{ base encoding.CodecV2 }

func newCodec() codec { return codec{base: encoding.GetCodecV2(proto.Name)} }

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if p, ok := v.(*preEncoded); ok && p.wire != nil {
		return mem.BufferSlice{mem.SliceBuffer(p.wire)}, nil
	}
	return c.base.Marshal(v)
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error { return c.base.Unmarshal(data, v) }

func (c codec) Name() string { return c.base.Name() }
