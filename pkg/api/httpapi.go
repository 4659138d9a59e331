package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/wire"
)

// maxBody bounds HTTP/JSON request bodies.
const maxBody = 1 << 20

var (
	jsonOut = protojson.MarshalOptions{EmitDefaultValues: true}
	// jsonCompact is jsonOut on one line (server-sent events carry one line of data).
	jsonCompact = protojson.MarshalOptions{EmitDefaultValues: true, Multiline: false}
	jsonIn      = protojson.UnmarshalOptions{}
)

// reply answers a handler's result: err in the one error model, else msg with code. msg may be
// a getter's result on a nil response (proto getters are nil-safe); it is not read on error.
func reply(w http.ResponseWriter, code int, msg proto.Message, err error) {
	if err != nil {
		writeStatus(w, err)
		return
	}
	writeProto(w, code, msg)
}

// writeProto writes msg as protojson (lowerCamelCase fields, enums by name, durations as
// "1.5s", timestamps as RFC 3339; scalar defaults included, unset messages omitted), indented
// with two spaces. protojson deliberately varies its whitespace between builds; re-indenting
// makes the output byte-stable.
func writeProto(w http.ResponseWriter, code int, msg proto.Message) {
	b, err := jsonOut.Marshal(msg)
	var out bytes.Buffer
	if err == nil {
		err = json.Indent(&out, b, "", "  ")
	}
	if err != nil {
		writeError(w, codes.Internal, wire.InternalCode, err.Error())
		return
	}
	out.WriteByte('\n')
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(out.Bytes())
}

// readProto decodes the request body (protojson) into msg; an empty body leaves msg empty.
func readProto(w http.ResponseWriter, r *http.Request, msg proto.Message) error {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return status.Errorf(codes.InvalidArgument, "request body is larger than %d bytes", maxBody)
		}
		return status.Errorf(codes.InvalidArgument, "reading request body: %v", err)
	}
	if len(b) == 0 {
		return nil
	}
	if err := jsonIn.Unmarshal(b, msg); err != nil {
		return status.Errorf(codes.InvalidArgument, "malformed JSON body: %v", err)
	}
	return nil
}

// pathService puts the path's service into a body's service field, refusing a different one.
func pathService(r *http.Request, body string) (string, error) {
	svc := r.PathValue("service")
	if body != "" && body != svc {
		return "", status.Errorf(codes.InvalidArgument, "body names service %q but the path names %q", body, svc)
	}
	return svc, nil
}

func (s *Server) registerSessions(mux *http.ServeMux) {
	x := sessionService{s: s}
	const coll = "/v1/services/{service}/sessions"
	const item = coll + "/{id}"

	mux.HandleFunc("POST "+coll, func(w http.ResponseWriter, r *http.Request) {
		req := &tetherv1.CreateSessionRequest{}
		if err := readProto(w, r, req); err != nil {
			writeStatus(w, err)
			return
		}
		var err error
		if req.Service, err = pathService(r, req.GetService()); err != nil {
			writeStatus(w, err)
			return
		}
		resp, err := x.CreateSession(r.Context(), req)
		if err != nil {
			writeStatus(w, err)
			return
		}
		w.Header().Set("Location", "/v1/services/"+url.PathEscape(req.GetService())+"/sessions/"+url.PathEscape(resp.GetSession().GetId()))
		writeProto(w, http.StatusCreated, resp.GetSession())
	})

	mux.HandleFunc("GET "+coll, func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		req := &tetherv1.ListSessionsRequest{
			Service:   r.PathValue("service"),
			PageToken: q.Get("pageToken"),
			Instance:  q.Get("instance"),
			SessionId: q.Get("id"),
		}
		if v := q.Get("limit"); v != "" {
			n, err := strconv.ParseInt(v, 10, 32)
			if err != nil || n < 0 {
				writeStatus(w, status.Errorf(codes.InvalidArgument, "limit %q must be a non-negative integer", v))
				return
			}
			req.PageSize = int32(n)
		}
		st, ok := parseSessionStatus(q.Get("status"))
		if !ok {
			writeStatus(w, status.Errorf(codes.InvalidArgument, "status %q must be Active, Expired or Terminated", q.Get("status")))
			return
		}
		if st != "" {
			req.Status = statusToProto[st]
		}
		resp, err := x.ListSessions(r.Context(), req)
		reply(w, http.StatusOK, resp, err)
	})

	mux.HandleFunc("GET "+item, func(w http.ResponseWriter, r *http.Request) {
		resp, err := x.GetSession(r.Context(), &tetherv1.GetSessionRequest{Service: r.PathValue("service"), SessionId: r.PathValue("id")})
		reply(w, http.StatusOK, resp.GetSession(), err)
	})

	update := func(w http.ResponseWriter, r *http.Request) {
		req := &tetherv1.UpdateSessionRequest{}
		if err := readProto(w, r, req); err != nil {
			writeStatus(w, err)
			return
		}
		var err error
		if req.Service, err = pathService(r, req.GetService()); err != nil {
			writeStatus(w, err)
			return
		}
		if id := r.PathValue("id"); req.GetSessionId() != "" && req.GetSessionId() != id {
			writeStatus(w, status.Errorf(codes.InvalidArgument, "body names session %q but the path names %q", req.GetSessionId(), id))
			return
		}
		req.SessionId = r.PathValue("id")
		resp, err := x.UpdateSession(r.Context(), req)
		reply(w, http.StatusOK, resp.GetSession(), err)
	}
	mux.HandleFunc("PUT "+item, update)
	mux.HandleFunc("PATCH "+item, update)

	mux.HandleFunc("DELETE "+item, func(w http.ResponseWriter, r *http.Request) {
		resp, err := x.DeleteSession(r.Context(), &tetherv1.DeleteSessionRequest{Service: r.PathValue("service"), SessionId: r.PathValue("id")})
		reply(w, http.StatusOK, resp, err)
	})
}

func (s *Server) registerInstances(mux *http.ServeMux) {
	x := instanceService{s: s}
	const coll = "/v1/services/{service}/instances"
	const item = coll + "/{id}"

	mux.HandleFunc("GET "+coll, func(w http.ResponseWriter, r *http.Request) {
		resp, err := x.ListInstances(r.Context(), &tetherv1.ListInstancesRequest{Service: r.PathValue("service")})
		reply(w, http.StatusOK, resp, err)
	})

	mux.HandleFunc("POST "+coll, func(w http.ResponseWriter, r *http.Request) {
		in := &tetherv1.Instance{}
		if err := readProto(w, r, in); err != nil {
			writeStatus(w, err)
			return
		}
		resp, err := x.RegisterInstance(r.Context(), &tetherv1.RegisterInstanceRequest{Service: r.PathValue("service"), Instance: in})
		if err != nil {
			writeStatus(w, err)
			return
		}
		w.Header().Set("Location", "/v1/services/"+url.PathEscape(r.PathValue("service"))+"/instances/"+url.PathEscape(in.GetId()))
		writeProto(w, http.StatusCreated, resp.GetInstance())
	})

	mux.HandleFunc("GET "+item, func(w http.ResponseWriter, r *http.Request) {
		k := registry.Key{Service: r.PathValue("service"), ID: r.PathValue("id")}
		if err := x.beginInstance(r.Context(), k.Service, k.ID, accessRead); err != nil {
			writeStatus(w, err)
			return
		}
		in, err := s.instance(r.Context(), k)
		reply(w, http.StatusOK, in, err)
	})

	mux.HandleFunc("DELETE "+item, func(w http.ResponseWriter, r *http.Request) {
		resp, err := x.DeregisterInstance(r.Context(), &tetherv1.DeregisterInstanceRequest{Service: r.PathValue("service"), InstanceId: r.PathValue("id")})
		reply(w, http.StatusOK, resp, err)
	})

	mux.HandleFunc("PUT "+item+"/state", instanceUpdate(readStateBody,
		func(ctx context.Context, req *tetherv1.SetInstanceStateRequest, service, id string) (*tetherv1.Instance, error) {
			req.Service, req.InstanceId = service, id
			resp, err := x.SetInstanceState(ctx, req)
			return resp.GetInstance(), err
		}))

	mux.HandleFunc("PUT "+item+"/health", instanceUpdate(readHealthBody,
		func(ctx context.Context, req *tetherv1.SetInstanceHealthRequest, service, id string) (*tetherv1.Instance, error) {
			req.Service, req.InstanceId = service, id
			resp, err := x.SetInstanceHealth(ctx, req)
			return resp.GetInstance(), err
		}))

	mux.HandleFunc("POST "+item+"/drain", func(w http.ResponseWriter, r *http.Request) {
		req := &tetherv1.DrainInstanceRequest{}
		if err := readProto(w, r, req); err != nil {
			writeStatus(w, err)
			return
		}
		req.Service, req.InstanceId = r.PathValue("service"), r.PathValue("id")
		if d := req.GetTimeout().AsDuration(); d > 0 && d <= MaxDrainTimeout {
			// The wait may outlast WriteTimeout: the answer gets WriteTimeout after it.
			_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(d + WriteTimeout))
		}
		resp, err := x.DrainInstance(r.Context(), req)
		reply(w, http.StatusOK, resp, err)
	})
}

// instanceUpdate is the handler of a PUT on one instance (its state, its health): the body read
// by read, the call made by call with the path's service and instance id, the instance as it
// is afterwards in the answer.
func instanceUpdate[R any](read func(http.ResponseWriter, *http.Request) (R, error),
	call func(ctx context.Context, req R, service, id string) (*tetherv1.Instance, error),
) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		req, err := read(w, r)
		if err != nil {
			writeStatus(w, err)
			return
		}
		in, err := call(r.Context(), req, r.PathValue("service"), r.PathValue("id"))
		reply(w, http.StatusOK, in, err)
	}
}

// readHealthBody decodes {"health": ...}: the enum name (INSTANCE_HEALTH_UNHEALTHY), its
// number, or the status word (unhealthy).
func readHealthBody(w http.ResponseWriter, r *http.Request) (*tetherv1.SetInstanceHealthRequest, error) {
	req := &tetherv1.SetInstanceHealthRequest{}
	var plain struct {
		Health string `json:"health"`
	}
	set := func() bool { return req.GetHealth() != tetherv1.InstanceHealth_INSTANCE_HEALTH_UNSPECIFIED }
	done, err := readEnumBody(w, r, req, set, &plain)
	if err != nil {
		return nil, err
	}
	if done {
		return req, nil
	}
	h, ok := tetherv1.InstanceHealth_value["INSTANCE_HEALTH_"+strings.TrimPrefix(strings.ToUpper(plain.Health), "INSTANCE_HEALTH_")]
	if !ok || h == 0 {
		return nil, status.Error(codes.InvalidArgument, fmt.Sprintf("health %q must be healthy, unhealthy or unknown", plain.Health))
	}
	req.Health = tetherv1.InstanceHealth(h)
	return req, nil
}

// readStateBody decodes {"state": ...}: the enum name (INSTANCE_STATE_DRAINING), its number, or
// the config file's word (draining).
func readStateBody(w http.ResponseWriter, r *http.Request) (*tetherv1.SetInstanceStateRequest, error) {
	req := &tetherv1.SetInstanceStateRequest{}
	var plain struct {
		State string `json:"state"`
	}
	set := func() bool { return req.GetState() != tetherv1.InstanceState_INSTANCE_STATE_UNSPECIFIED }
	done, err := readEnumBody(w, r, req, set, &plain)
	if err != nil {
		return nil, err
	}
	if done {
		return req, nil
	}
	st, ok := parseInstanceState(plain.State)
	if !ok {
		return nil, status.Error(codes.InvalidArgument, fmt.Sprintf("state %q must be active, standby or draining", plain.State))
	}
	req.State = st
	return req, nil
}

// readEnumBody reads a body of one enum field into req as protojson; done when that sets the
// field (set). Otherwise it decodes the body into plain, a struct of the field as a word, for
// the caller to map; an error is an InvalidArgument status (req is then not to be used).
func readEnumBody(w http.ResponseWriter, r *http.Request, req proto.Message, set func() bool, plain any) (done bool, err error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		return false, status.Errorf(codes.InvalidArgument, "reading request body: %v", err)
	}
	if jsonIn.Unmarshal(b, req) == nil && set() {
		return true, nil
	}
	if err := json.Unmarshal(b, plain); err != nil {
		return false, status.Errorf(codes.InvalidArgument, "malformed JSON body: %v", err)
	}
	return false, nil
}
