package api

import (
	"maps"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tether-dev/tether/pkg/affinity"
	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/session"
	tstatus "github.com/tether-dev/tether/pkg/status"
)

var kindToProto = map[session.Kind]tetherv1.AffinityKind{
	session.KindCookie:        tetherv1.AffinityKind_AFFINITY_KIND_COOKIE,
	session.KindHeader:        tetherv1.AffinityKind_AFFINITY_KIND_HEADER,
	session.KindMCPStreamable: tetherv1.AffinityKind_AFFINITY_KIND_MCP_STREAMABLE,
	session.KindMCPSSE:        tetherv1.AffinityKind_AFFINITY_KIND_MCP_SSE,
	session.KindSticky:        tetherv1.AffinityKind_AFFINITY_KIND_STICKY,
	session.KindMCPHandle:     tetherv1.AffinityKind_AFFINITY_KIND_MCP_HANDLE,
}

var statusToProto = map[session.Status]tetherv1.SessionStatus{
	session.StatusActive:     tetherv1.SessionStatus_SESSION_STATUS_ACTIVE,
	session.StatusExpired:    tetherv1.SessionStatus_SESSION_STATUS_EXPIRED,
	session.StatusTerminated: tetherv1.SessionStatus_SESSION_STATUS_TERMINATED,
}

func statusFromProto(s tetherv1.SessionStatus) (session.Status, bool) {
	for k, v := range statusToProto {
		if v == s {
			return k, true
		}
	}
	return "", s == tetherv1.SessionStatus_SESSION_STATUS_UNSPECIFIED
}

// parseSessionStatus accepts a status as written in a query string: "Active", "active",
// "ACTIVE" or "SESSION_STATUS_ACTIVE" (likewise Expired, Terminated); "" means any.
func parseSessionStatus(v string) (session.Status, bool) {
	u := strings.TrimPrefix(strings.ToUpper(v), "SESSION_STATUS_")
	switch u {
	case "", "UNSPECIFIED":
		return "", true
	case "ACTIVE":
		return session.StatusActive, true
	case "EXPIRED":
		return session.StatusExpired, true
	case "TERMINATED":
		return session.StatusTerminated, true
	}
	return "", false
}

func timestamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func sessionToProto(s session.Session) *tetherv1.Session {
	return &tetherv1.Session{
		Id:                    s.ID,
		Service:               s.Service,
		AffinityKind:          kindToProto[s.Kind],
		Instance:              s.Instance,
		CreateTime:            timestamp(s.Created),
		UpdateTime:            timestamp(s.LastModified),
		LastSeenTime:          timestamp(s.LastSeen),
		Ttl:                   durationpb.New(s.TTL),
		IdleTimeout:           durationpb.New(s.IdleTimeout),
		Status:                statusToProto[s.Status],
		DisableSessionIdReuse: s.DisableReuse,
		Attributes:            maps.Clone(s.Attributes),
		ExpireTime:            timestamp(s.ExpiresAt()),
		EndTime:               timestamp(s.Ended),
	}
}

func stateFromProto(s tetherv1.InstanceState) (registry.State, bool) {
	return tstatus.StateFromProto(s)
}

// parseInstanceState accepts "active", "ACTIVE" or "INSTANCE_STATE_ACTIVE" (likewise standby,
// draining).
func parseInstanceState(v string) (tetherv1.InstanceState, bool) {
	s, ok := tetherv1.InstanceState_value["INSTANCE_STATE_"+strings.TrimPrefix(strings.ToUpper(v), "INSTANCE_STATE_")]
	if !ok || s == 0 {
		return 0, false
	}
	return tetherv1.InstanceState(s), true
}

func instanceToProto(in registry.Instance) *tetherv1.Instance { return tstatus.InstanceProto(in) }

func usageToProto(u affinity.InstanceUsage) *tetherv1.Instance { return tstatus.UsageProto(u) }
