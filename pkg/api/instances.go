package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/registry"
	tstatus "github.com/tether-dev/tether/pkg/status"
)

// MaxDrainTimeout bounds DrainInstance's wait.
const MaxDrainTimeout = 24 * time.Hour

// instanceIDRe is the config file's rule for instance ids.
var instanceIDRe = regexp.MustCompile(`^[A-Za-z0-9]([-._A-Za-z0-9]*[A-Za-z0-9])?$`)

// instanceService implements tetherv1.InstanceServiceServer over the registry (and the engine
// for slot usage and drain-and-wait).
type instanceService struct {
	tetherv1.UnimplementedInstanceServiceServer
	s *Server
}

var _ tetherv1.InstanceServiceServer = instanceService{}

func (x instanceService) begin(ctx context.Context, service string, a access) error {
	return x.s.authorizeService(ctx, service, a)
}

// beginInstance is begin for a call on one instance: its id must be valid as well.
func (x instanceService) beginInstance(ctx context.Context, service, id string, a access) error {
	if err := x.begin(ctx, service, a); err != nil {
		return err
	}
	return checkInstanceID(id)
}

func checkInstanceID(id string) error {
	if id == "" {
		return status.Error(codes.InvalidArgument, "instance id is required")
	}
	if len(id) > 63 || !instanceIDRe.MatchString(id) {
		return status.Errorf(codes.InvalidArgument, "instance id %q is malformed: want at most 63 letters, digits, '-', '.' and '_', starting and ending with a letter or digit", id)
	}
	return nil
}

// instances returns the service's instances ordered by id, with slot usage when the server
// has an engine.
func (s *Server) instances(ctx context.Context, service string) ([]*tetherv1.Instance, error) {
	snap := s.reg.Snapshot()
	if _, ok := snap.Service(service); !ok {
		return nil, status.Errorf(codes.NotFound, "service %q not found", service)
	}
	if s.engine != nil {
		usage, err := s.engine.Usage(service)
		if err != nil {
			return nil, s.toStatus(ctx, err)
		}
		out := make([]*tetherv1.Instance, len(usage))
		for i, u := range usage {
			out[i] = usageToProto(u)
		}
		if s.calls != nil {
			slices.SortFunc(out, func(x, y *tetherv1.Instance) int { return strings.Compare(x.GetId(), y.GetId()) })
			tstatus.AddCalls(out, s.calls(service))
		}
		return out, nil
	}
	list := snap.Instances(service)
	out := make([]*tetherv1.Instance, len(list))
	for i, in := range list {
		out[i] = instanceToProto(in)
	}
	return out, nil
}

// instance returns one instance with its usage.
func (s *Server) instance(ctx context.Context, k registry.Key) (*tetherv1.Instance, error) {
	list, err := s.instances(ctx, k.Service)
	if err != nil {
		return nil, err
	}
	for _, in := range list {
		if in.GetId() == k.ID {
			return in, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "instance %s/%s not found", k.Service, k.ID)
}

// ListInstances implements tetherv1.InstanceServiceServer.
func (x instanceService) ListInstances(ctx context.Context, req *tetherv1.ListInstancesRequest) (*tetherv1.ListInstancesResponse, error) {
	if err := x.begin(ctx, req.GetService(), accessRead); err != nil {
		return nil, err
	}
	list, err := x.s.instances(ctx, req.GetService())
	if err != nil {
		return nil, err
	}
	out := &tetherv1.ListInstancesResponse{Instances: list}
	if x.s.engine != nil {
		out.DesiredInstances = int32(x.s.engine.DesiredInstances(req.GetService()))
	}
	return out, nil
}

// RegisterInstance implements tetherv1.InstanceServiceServer.
func (x instanceService) RegisterInstance(ctx context.Context, req *tetherv1.RegisterInstanceRequest) (*tetherv1.RegisterInstanceResponse, error) {
	if err := x.begin(ctx, req.GetService(), accessWrite); err != nil {
		return nil, err
	}
	in, err := registration(req)
	if err != nil {
		return nil, err
	}
	if err := x.s.reg.Register(in); err != nil {
		return nil, x.s.toStatus(ctx, err)
	}
	x.s.log.LogAttrs(ctx, slog.LevelInfo, "api: instance registered", principalAttr(ctx),
		slog.String("service", in.Service), slog.String("instance", in.ID), slog.String("addr", in.Address))
	out, err := x.s.instance(ctx, in.Key())
	if err != nil {
		return nil, err
	}
	return &tetherv1.RegisterInstanceResponse{Instance: out}, nil
}

// registration checks a RegisterInstanceRequest and returns the instance it registers.
func registration(req *tetherv1.RegisterInstanceRequest) (registry.Instance, error) {
	p := req.GetInstance()
	if p == nil {
		return registry.Instance{}, status.Error(codes.InvalidArgument, "instance is required")
	}
	if p.GetService() != "" && p.GetService() != req.GetService() {
		return registry.Instance{}, status.Errorf(codes.InvalidArgument, "instance.service %q differs from service %q", p.GetService(), req.GetService())
	}
	if err := checkInstanceID(p.GetId()); err != nil {
		return registry.Instance{}, err
	}
	addr, err := registrationAddr(p.GetAddress())
	if err != nil {
		return registry.Instance{}, err
	}
	if err := registrationPorts(p.GetHttpPort(), p.GetSipPort()); err != nil {
		return registry.Instance{}, err
	}
	if p.GetWeight() > 1000 {
		return registry.Instance{}, status.Errorf(codes.InvalidArgument, "weight %d is out of range 1..1000", p.GetWeight())
	}
	state := registry.StateActive
	if p.GetState() != tetherv1.InstanceState_INSTANCE_STATE_UNSPECIFIED {
		var ok bool
		if state, ok = stateFromProto(p.GetState()); !ok {
			return registry.Instance{}, status.Errorf(codes.InvalidArgument, "state %v is not an instance state", p.GetState())
		}
	}
	return registry.Instance{
		Service: req.GetService(), ID: p.GetId(), Address: addr.String(),
		HTTPPort: int(p.GetHttpPort()), SIPPort: int(p.GetSipPort()),
		Weight: p.GetWeight(), Zone: p.GetZone(), State: state,
	}, nil
}

// registrationAddr parses an instance's address: an IP literal without a zone, not the
// unspecified address.
func registrationAddr(s string) (netip.Addr, error) {
	addr, err := netip.ParseAddr(s)
	if err != nil || addr.Zone() != "" {
		return netip.Addr{}, status.Errorf(codes.InvalidArgument, "address %q must be an IP literal", s)
	}
	if addr.IsUnspecified() {
		// As config validation: Envoy cannot send a request to 0.0.0.0 or ::.
		return netip.Addr{}, status.Errorf(codes.InvalidArgument, "address %s is the unspecified address, not an instance's address", addr)
	}
	return addr, nil
}

// registrationPorts checks an instance's ports: each in 0..65535, and at least one set.
func registrationPorts(httpPort, sipPort int32) error {
	for _, port := range []struct {
		name string
		v    int32
	}{{"http_port", httpPort}, {"sip_port", sipPort}} {
		if port.v < 0 || port.v > 65535 {
			return status.Errorf(codes.InvalidArgument, "%s %d is out of range 0..65535", port.name, port.v)
		}
	}
	if httpPort == 0 && sipPort == 0 {
		return status.Error(codes.InvalidArgument, "at least one of http_port and sip_port is required")
	}
	return nil
}

// DeregisterInstance implements tetherv1.InstanceServiceServer.
func (x instanceService) DeregisterInstance(ctx context.Context, req *tetherv1.DeregisterInstanceRequest) (*tetherv1.DeregisterInstanceResponse, error) {
	if err := x.beginInstance(ctx, req.GetService(), req.GetInstanceId(), accessWrite); err != nil {
		return nil, err
	}
	k := registry.Key{Service: req.GetService(), ID: req.GetInstanceId()}
	if err := x.s.reg.Deregister(k); err != nil {
		return nil, x.s.toStatus(ctx, err)
	}
	x.s.log.LogAttrs(ctx, slog.LevelInfo, "api: instance deregistered", principalAttr(ctx),
		slog.String("service", k.Service), slog.String("instance", k.ID))
	return &tetherv1.DeregisterInstanceResponse{}, nil
}

// setState validates and applies a state change.
func (x instanceService) setState(ctx context.Context, k registry.Key, st tetherv1.InstanceState) error {
	if err := checkInstanceID(k.ID); err != nil {
		return err
	}
	state, ok := stateFromProto(st)
	if !ok {
		return status.Errorf(codes.InvalidArgument, "state %v is not an instance state (want active, standby or draining)", st)
	}
	if err := x.s.reg.SetState(k, state); err != nil {
		return x.s.toStatus(ctx, err)
	}
	x.s.log.LogAttrs(ctx, slog.LevelInfo, "api: instance state set", principalAttr(ctx),
		slog.String("service", k.Service), slog.String("instance", k.ID), slog.String("state", string(state)))
	return nil
}

// SetInstanceState implements tetherv1.InstanceServiceServer.
func (x instanceService) SetInstanceState(ctx context.Context, req *tetherv1.SetInstanceStateRequest) (*tetherv1.SetInstanceStateResponse, error) {
	if err := x.begin(ctx, req.GetService(), accessWrite); err != nil {
		return nil, err
	}
	k := registry.Key{Service: req.GetService(), ID: req.GetInstanceId()}
	if err := x.setState(ctx, k, req.GetState()); err != nil {
		return nil, err
	}
	out, err := x.s.instance(ctx, k)
	if err != nil {
		return nil, err
	}
	return &tetherv1.SetInstanceStateResponse{Instance: out}, nil
}

// SetInstanceHealth implements tetherv1.InstanceServiceServer: an external verdict for an
// instance of a service tether does not health-check itself.
func (x instanceService) SetInstanceHealth(ctx context.Context, req *tetherv1.SetInstanceHealthRequest) (*tetherv1.SetInstanceHealthResponse, error) {
	if err := x.beginInstance(ctx, req.GetService(), req.GetInstanceId(), accessWrite); err != nil {
		return nil, err
	}
	h, ok := tstatus.HealthFromProto(req.GetHealth())
	if !ok {
		return nil, status.Error(codes.InvalidArgument, "health must be HEALTHY, UNHEALTHY or UNKNOWN")
	}
	k := registry.Key{Service: req.GetService(), ID: req.GetInstanceId()}
	if svc, ok := x.s.reg.Snapshot().Service(k.Service); ok && svc.HealthCheck.Enabled() {
		return nil, status.Errorf(codes.FailedPrecondition, "service %q has health checks: their verdicts would replace this one (drain the instance instead)", k.Service)
	}
	if _, err := x.s.reg.SetHealth(k, h); err != nil {
		return nil, x.s.toStatus(ctx, err)
	}
	x.s.log.LogAttrs(ctx, slog.LevelInfo, "api: instance health set", principalAttr(ctx),
		slog.String("service", k.Service), slog.String("instance", k.ID), slog.String("health", string(h)))
	out, err := x.s.instance(ctx, k)
	if err != nil {
		return nil, err
	}
	return &tetherv1.SetInstanceHealthResponse{Instance: out}, nil
}

// DrainInstance implements tetherv1.InstanceServiceServer: it sets the instance draining, then
// waits (up to the timeout and the call's deadline) until it holds no session and no request.
// The timeout running out is not an error: the answer says drained=false with the usage left.
// The call's own deadline or cancellation is an error (DeadlineExceeded / Canceled).
func (x instanceService) DrainInstance(ctx context.Context, req *tetherv1.DrainInstanceRequest) (*tetherv1.DrainInstanceResponse, error) {
	if err := x.begin(ctx, req.GetService(), accessWrite); err != nil {
		return nil, err
	}
	var timeout time.Duration
	if d, err := duration("timeout", req.GetTimeout()); err != nil {
		return nil, err
	} else if d != nil {
		timeout = *d
	}
	if timeout > MaxDrainTimeout {
		return nil, status.Errorf(codes.InvalidArgument, "timeout %v is above %v", timeout, MaxDrainTimeout)
	}
	k := registry.Key{Service: req.GetService(), ID: req.GetInstanceId()}
	if err := x.setState(ctx, k, tetherv1.InstanceState_INSTANCE_STATE_DRAINING); err != nil {
		return nil, err
	}
	out, err := x.s.instance(ctx, k)
	if err != nil {
		return nil, err
	}
	if x.s.engine == nil { // no counters to wait on
		return &tetherv1.DrainInstanceResponse{Instance: out}, nil
	}
	drained := out.GetSessions() == 0 && out.GetRequests() == 0
	if !drained && timeout > 0 {
		wctx, cancel := context.WithTimeout(ctx, timeout)
		err := x.s.engine.WaitDrained(wctx, k)
		cancel()
		switch {
		case err == nil:
			drained = true
		case ctx.Err() != nil:
			return nil, x.s.toStatus(ctx, fmt.Errorf("draining %s/%s: %w", k.Service, k.ID, ctx.Err()))
		case !errors.Is(err, context.DeadlineExceeded):
			return nil, x.s.toStatus(ctx, err)
		}
		if out, err = x.s.instance(ctx, k); err != nil {
			return nil, err
		}
	}
	x.s.log.LogAttrs(ctx, slog.LevelInfo, "api: instance drain", principalAttr(ctx),
		slog.String("service", k.Service), slog.String("instance", k.ID), slog.Bool("drained", drained))
	return &tetherv1.DrainInstanceResponse{Instance: out, Drained: drained}, nil
}
