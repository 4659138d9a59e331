package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tether-dev/tether/pkg/api/apitest"
	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/wire"
)

// client is one transport to the API. Errors are gRPC status errors for both transports: the
// HTTP client turns the {"errorCode","errorMessage"} body back into one (and checks that the
// HTTP status matches the documented mapping).
type client interface {
	CreateSession(ctx context.Context, req *tetherv1.CreateSessionRequest) (*tetherv1.Session, error)
	GetSession(ctx context.Context, service, id string) (*tetherv1.Session, error)
	UpdateSession(ctx context.Context, req *tetherv1.UpdateSessionRequest) (*tetherv1.Session, error)
	ListSessions(ctx context.Context, req *tetherv1.ListSessionsRequest) (*tetherv1.ListSessionsResponse, error)
	DeleteSession(ctx context.Context, service, id string) error
	ListInstances(ctx context.Context, service string) (*tetherv1.ListInstancesResponse, error)
	RegisterInstance(ctx context.Context, service string, in *tetherv1.Instance) (*tetherv1.Instance, error)
	DeregisterInstance(ctx context.Context, service, id string) error
	SetInstanceState(ctx context.Context, service, id string, st tetherv1.InstanceState) (*tetherv1.Instance, error)
	SetInstanceHealth(ctx context.Context, service, id string, h tetherv1.InstanceHealth) (*tetherv1.Instance, error)
	DrainInstance(ctx context.Context, service, id string, timeout time.Duration) (*tetherv1.DrainInstanceResponse, error)
}

// transport makes a client for a server and a bearer token ("" = none).
type transport struct {
	name string
	new  func(t testing.TB, s *apitest.Server, token string) client
}

var transports = []transport{
	{"grpc", func(t testing.TB, s *apitest.Server, token string) client {
		conn := s.Dial(t)
		return &grpcClient{token: token, sess: tetherv1.NewSessionServiceClient(conn), inst: tetherv1.NewInstanceServiceClient(conn)}
	}},
	{"http", func(t testing.TB, s *apitest.Server, token string) client {
		return &httpClient{t: t, base: s.URL, token: token}
	}},
}

// forEachTransport runs f as a subtest per transport.
func forEachTransport(t *testing.T, f func(t *testing.T, tr transport)) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) { f(t, tr) })
	}
}

type grpcClient struct {
	token string
	sess  tetherv1.SessionServiceClient
	inst  tetherv1.InstanceServiceClient
}

func (c *grpcClient) ctx(ctx context.Context) context.Context {
	if c.token == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.token)
}

func (c *grpcClient) CreateSession(ctx context.Context, req *tetherv1.CreateSessionRequest) (*tetherv1.Session, error) {
	r, err := c.sess.CreateSession(c.ctx(ctx), req)
	return r.GetSession(), err
}

func (c *grpcClient) GetSession(ctx context.Context, service, id string) (*tetherv1.Session, error) {
	r, err := c.sess.GetSession(c.ctx(ctx), &tetherv1.GetSessionRequest{Service: service, SessionId: id})
	return r.GetSession(), err
}

func (c *grpcClient) UpdateSession(ctx context.Context, req *tetherv1.UpdateSessionRequest) (*tetherv1.Session, error) {
	r, err := c.sess.UpdateSession(c.ctx(ctx), req)
	return r.GetSession(), err
}

func (c *grpcClient) ListSessions(ctx context.Context, req *tetherv1.ListSessionsRequest) (*tetherv1.ListSessionsResponse, error) {
	return c.sess.ListSessions(c.ctx(ctx), req)
}

func (c *grpcClient) DeleteSession(ctx context.Context, service, id string) error {
	_, err := c.sess.DeleteSession(c.ctx(ctx), &tetherv1.DeleteSessionRequest{Service: service, SessionId: id})
	return err
}

func (c *grpcClient) ListInstances(ctx context.Context, service string) (*tetherv1.ListInstancesResponse, error) {
	return c.inst.ListInstances(c.ctx(ctx), &tetherv1.ListInstancesRequest{Service: service})
}

func (c *grpcClient) RegisterInstance(ctx context.Context, service string, in *tetherv1.Instance) (*tetherv1.Instance, error) {
	r, err := c.inst.RegisterInstance(c.ctx(ctx), &tetherv1.RegisterInstanceRequest{Service: service, Instance: in})
	return r.GetInstance(), err
}

func (c *grpcClient) DeregisterInstance(ctx context.Context, service, id string) error {
	_, err := c.inst.DeregisterInstance(c.ctx(ctx), &tetherv1.DeregisterInstanceRequest{Service: service, InstanceId: id})
	return err
}

func (c *grpcClient) SetInstanceState(ctx context.Context, service, id string, st tetherv1.InstanceState) (*tetherv1.Instance, error) {
	r, err := c.inst.SetInstanceState(c.ctx(ctx), &tetherv1.SetInstanceStateRequest{Service: service, InstanceId: id, State: st})
	return r.GetInstance(), err
}

func (c *grpcClient) SetInstanceHealth(ctx context.Context, service, id string, h tetherv1.InstanceHealth) (*tetherv1.Instance, error) {
	r, err := c.inst.SetInstanceHealth(c.ctx(ctx), &tetherv1.SetInstanceHealthRequest{Service: service, InstanceId: id, Health: h})
	return r.GetInstance(), err
}

func (c *grpcClient) DrainInstance(ctx context.Context, service, id string, timeout time.Duration) (*tetherv1.DrainInstanceResponse, error) {
	return c.inst.DrainInstance(c.ctx(ctx), &tetherv1.DrainInstanceRequest{Service: service, InstanceId: id, Timeout: durationpb.New(timeout)})
}

// httpClient speaks the HTTP/JSON API over HTTP/1.1.
type httpClient struct {
	t     testing.TB
	base  string
	token string
}

// wantHTTP is the documented HTTP status of each error code.
var wantHTTP = map[codes.Code]int{
	codes.InvalidArgument:    400,
	codes.FailedPrecondition: 400,
	codes.NotFound:           404,
	codes.AlreadyExists:      409,
	codes.ResourceExhausted:  429,
	codes.Unauthenticated:    401,
	codes.PermissionDenied:   403,
	codes.Unavailable:        503,
	codes.DeadlineExceeded:   504,
	codes.Internal:           500,
}

// do sends a request and decodes a 2xx body into out (if not nil) or the error model.
func (c *httpClient) do(ctx context.Context, method, path string, body proto.Message, wantOK int, out proto.Message) error {
	var rd io.Reader
	if body != nil {
		b, err := protojson.Marshal(body)
		if err != nil {
			c.t.Fatalf("marshal: %v", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		c.t.Fatalf("new request: %v", err)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set(wire.ClientHeader, "test")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		c.t.Errorf("%s %s: content type %q, want application/json", method, path, ct)
	}
	if resp.StatusCode >= 300 {
		var e wire.ErrorBody
		if err := json.Unmarshal(b, &e); err != nil || e.ErrorCode == "" {
			c.t.Fatalf("%s %s: %d with a body outside the error model: %s", method, path, resp.StatusCode, b)
		}
		code, ok := codeByName[e.Status]
		if !ok {
			c.t.Fatalf("%s %s: unknown status %q", method, path, e.Status)
		}
		if want := wantHTTP[code]; want != resp.StatusCode {
			c.t.Errorf("%s %s: errorCode %s came with HTTP %d, want %d", method, path, e.ErrorCode, resp.StatusCode, want)
		}
		if code == codes.Unauthenticated && resp.Header.Get("WWW-Authenticate") == "" {
			c.t.Errorf("%s %s: 401 without WWW-Authenticate", method, path)
		}
		return status.Error(code, e.ErrorMessage)
	}
	if resp.StatusCode != wantOK {
		c.t.Errorf("%s %s: HTTP %d, want %d", method, path, resp.StatusCode, wantOK)
	}
	if out != nil {
		if err := protojson.Unmarshal(b, out); err != nil {
			c.t.Fatalf("%s %s: decoding %s: %v", method, path, b, err)
		}
	}
	return nil
}

var codeByName = func() map[string]codes.Code {
	m := map[string]codes.Code{}
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		m[c.String()] = c
	}
	return m
}()

func sessionsPath(service string) string {
	return "/v1/services/" + url.PathEscape(service) + "/sessions"
}
func instancesPath(service string) string {
	return "/v1/services/" + url.PathEscape(service) + "/instances"
}

func (c *httpClient) CreateSession(ctx context.Context, req *tetherv1.CreateSessionRequest) (*tetherv1.Session, error) {
	out := &tetherv1.Session{}
	body := proto.Clone(req).(*tetherv1.CreateSessionRequest)
	body.Service = "" // the path names it
	if err := c.do(ctx, "POST", sessionsPath(req.GetService()), body, 201, out); err != nil {
		return nil, err
	}
	return out, nil
}

func (c *httpClient) GetSession(ctx context.Context, service, id string) (*tetherv1.Session, error) {
	out := &tetherv1.Session{}
	if err := c.do(ctx, "GET", sessionsPath(service)+"/"+url.PathEscape(id), nil, 200, out); err != nil {
		return nil, err
	}
	return out, nil
}

func (c *httpClient) UpdateSession(ctx context.Context, req *tetherv1.UpdateSessionRequest) (*tetherv1.Session, error) {
	out := &tetherv1.Session{}
	body := proto.Clone(req).(*tetherv1.UpdateSessionRequest)
	body.Service, body.SessionId = "", ""
	if err := c.do(ctx, "PATCH", sessionsPath(req.GetService())+"/"+url.PathEscape(req.GetSessionId()), body, 200, out); err != nil {
		return nil, err
	}
	return out, nil
}

var statusWord = map[tetherv1.SessionStatus]string{
	tetherv1.SessionStatus_SESSION_STATUS_ACTIVE:     "Active",
	tetherv1.SessionStatus_SESSION_STATUS_EXPIRED:    "Expired",
	tetherv1.SessionStatus_SESSION_STATUS_TERMINATED: "Terminated",
}

func (c *httpClient) ListSessions(ctx context.Context, req *tetherv1.ListSessionsRequest) (*tetherv1.ListSessionsResponse, error) {
	q := url.Values{}
	if req.GetPageSize() != 0 {
		q.Set("limit", strconv.Itoa(int(req.GetPageSize())))
	}
	for k, v := range map[string]string{"pageToken": req.GetPageToken(), "instance": req.GetInstance(), "id": req.GetSessionId(), "status": statusWord[req.GetStatus()]} {
		if v != "" {
			q.Set(k, v)
		}
	}
	out := &tetherv1.ListSessionsResponse{}
	if err := c.do(ctx, "GET", sessionsPath(req.GetService())+"?"+q.Encode(), nil, 200, out); err != nil {
		return nil, err
	}
	return out, nil
}

func (c *httpClient) DeleteSession(ctx context.Context, service, id string) error {
	return c.do(ctx, "DELETE", sessionsPath(service)+"/"+url.PathEscape(id), nil, 200, &tetherv1.DeleteSessionResponse{})
}

func (c *httpClient) ListInstances(ctx context.Context, service string) (*tetherv1.ListInstancesResponse, error) {
	out := &tetherv1.ListInstancesResponse{}
	if err := c.do(ctx, "GET", instancesPath(service), nil, 200, out); err != nil {
		return nil, err
	}
	return out, nil
}

func (c *httpClient) RegisterInstance(ctx context.Context, service string, in *tetherv1.Instance) (*tetherv1.Instance, error) {
	out := &tetherv1.Instance{}
	if err := c.do(ctx, "POST", instancesPath(service), in, 201, out); err != nil {
		return nil, err
	}
	return out, nil
}

func (c *httpClient) DeregisterInstance(ctx context.Context, service, id string) error {
	return c.do(ctx, "DELETE", instancesPath(service)+"/"+url.PathEscape(id), nil, 200, &tetherv1.DeregisterInstanceResponse{})
}

func (c *httpClient) SetInstanceState(ctx context.Context, service, id string, st tetherv1.InstanceState) (*tetherv1.Instance, error) {
	out := &tetherv1.Instance{}
	if err := c.do(ctx, "PUT", instancesPath(service)+"/"+url.PathEscape(id)+"/state", &tetherv1.SetInstanceStateRequest{State: st}, 200, out); err != nil {
		return nil, err
	}
	return out, nil
}

func (c *httpClient) SetInstanceHealth(ctx context.Context, service, id string, h tetherv1.InstanceHealth) (*tetherv1.Instance, error) {
	out := &tetherv1.Instance{}
	if err := c.do(ctx, "PUT", instancesPath(service)+"/"+url.PathEscape(id)+"/health", &tetherv1.SetInstanceHealthRequest{Health: h}, 200, out); err != nil {
		return nil, err
	}
	return out, nil
}

func (c *httpClient) DrainInstance(ctx context.Context, service, id string, timeout time.Duration) (*tetherv1.DrainInstanceResponse, error) {
	out := &tetherv1.DrainInstanceResponse{}
	if err := c.do(ctx, "POST", instancesPath(service)+"/"+url.PathEscape(id)+"/drain", &tetherv1.DrainInstanceRequest{Timeout: durationpb.New(timeout)}, 200, out); err != nil {
		return nil, err
	}
	return out, nil
}

// wantCode fails unless err has code c (codes.OK = nil) and, if given, a message containing msg.
func wantCode(t *testing.T, what string, err error, c codes.Code, msg string) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok {
		t.Errorf("%s: error %v is not a gRPC status", what, err)
		return
	}
	if st.Code() != c {
		t.Errorf("%s: code %v (%q), want %v", what, st.Code(), st.Message(), c)
		return
	}
	if msg != "" && !strings.Contains(strings.ToLower(st.Message()), strings.ToLower(msg)) {
		t.Errorf("%s: message %q does not mention %q", what, st.Message(), msg)
	}
}
