package api

import (
	"context"
	"net/http"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tether-dev/tether/pkg/affinity"
	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/registry"
	tstatus "github.com/tether-dev/tether/pkg/status"
)

// RingLooker is the engine's ring lookup; *affinity.Engine implements it.
type RingLooker interface {
	RingLookup(ctx context.Context, service string, p affinity.Protocol, key string) (registry.Instance, error)
}

// LookupRing implements tetherv1.InstanceServiceServer.
func (x instanceService) LookupRing(ctx context.Context, req *tetherv1.LookupRingRequest) (*tetherv1.LookupRingResponse, error) {
	if err := x.begin(ctx, req.GetService(), accessRead); err != nil {
		return nil, err
	}
	rl, ok := x.s.engine.(RingLooker)
	if !ok {
		return nil, status.Error(codes.Unavailable, "this server has no engine to look the ring up in")
	}
	if req.GetKey() == "" {
		return nil, status.Error(codes.InvalidArgument, "key is required")
	}
	p, proto := affinity.ProtocolHTTP, tetherv1.RingProtocol_RING_PROTOCOL_HTTP
	if req.GetProtocol() == tetherv1.RingProtocol_RING_PROTOCOL_SIP {
		p, proto = affinity.ProtocolSIP, tetherv1.RingProtocol_RING_PROTOCOL_SIP
	}
	in, err := rl.RingLookup(ctx, req.GetService(), p, req.GetKey())
	if err != nil {
		return nil, x.s.toStatus(ctx, err)
	}
	out, err := x.s.instance(ctx, in.Key())
	if err != nil {
		out = tstatus.InstanceProto(in)
	}
	return &tetherv1.LookupRingResponse{Key: req.GetKey(), Protocol: proto, Instance: out}, nil
}

// registerRing serves GET /v1/services/{service}/ring?key=K[&protocol=sip|http].
func (s *Server) registerRing(mux *http.ServeMux) {
	x := instanceService{s: s}
	mux.HandleFunc("GET /v1/services/{service}/ring", func(w http.ResponseWriter, r *http.Request) {
		req := &tetherv1.LookupRingRequest{Service: r.PathValue("service"), Key: r.URL.Query().Get("key")}
		switch p := strings.ToLower(r.URL.Query().Get("protocol")); p {
		case "", "http":
		case "sip":
			req.Protocol = tetherv1.RingProtocol_RING_PROTOCOL_SIP
		default:
			writeStatus(w, status.Errorf(codes.InvalidArgument, "protocol %q: want http or sip", p))
			return
		}
		resp, err := x.LookupRing(r.Context(), req)
		reply(w, http.StatusOK, resp, err)
	})
}
