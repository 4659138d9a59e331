package edscache

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/types/known/emptypb"
)

// wireRequest receives one request's wire form. With the filters' codec (ServerOption) the
// bytes are copied into wire, a buffer from the filters' pool; under any other proto codec it
// decodes as an empty message whose unknown fields are the same bytes (slower, same result).
type wireRequest struct {
	emptypb.Empty
	wire     []byte
	viaCodec bool
}

// bytes returns the request's wire form, valid until the next receive into r.
func (r *wireRequest) bytes() []byte {
	if r.viaCodec {
		return r.wire
	}
	return r.ProtoReflect().GetUnknown()
}

// ServerOption returns the gRPC server option that lets the filters read requests' wire forms
// without decoding them (one copy into a pooled buffer). Every other message goes
// through gRPC's proto codec. A server without it still works, with one allocation more per
// request.
func (fs *Filters) ServerOption() grpc.ServerOption {
	return grpc.ForceServerCodecV2(wireCodec{encoding.GetCodecV2(proto.Name)})
}

// wireCodec is gRPC's proto codec, except that it copies a wireRequest's bytes.
type wireCodec struct{ encoding.CodecV2 }

func (c wireCodec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*wireRequest)
	if !ok {
		return c.CodecV2.Unmarshal(data, v)
	}
	r.wire, r.viaCodec = r.wire[:0], true
	for _, b := range data {
		r.wire = append(r.wire, b.ReadOnlyData()...)
	}
	return nil
}
