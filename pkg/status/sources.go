package status

import (
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/extproc"
	"github.com/tether-dev/tether/pkg/xds"
)

// StoreState is what a replica knows of the Redis it shares (redisstore and quota).
type StoreState struct {
	Reachable, Degraded bool
	// EpochChanges counts the new epochs of Redis's data set met; LastEpochChange is when the
	// last was met (zero: never) and Hold the learning window after it.
	EpochChanges    int64
	LastEpochChange time.Time
	Hold            time.Duration
}

// StoreStatus is the snapshot part of the shared store's state.
func StoreStatus(s StoreState) *tetherv1.StoreStatus {
	p := &tetherv1.StoreStatus{Reachable: s.Reachable, Degraded: s.Degraded, EpochChanges: s.EpochChanges}
	if !s.LastEpochChange.IsZero() {
		p.LastEpochChangeTime = timestamppb.New(s.LastEpochChange)
		p.LearningUntil = timestamppb.New(s.LastEpochChange.Add(s.Hold))
	}
	return p
}

// ExtProcStatus is the snapshot part of an ext_proc server's counters.
func ExtProcStatus(st extproc.Stats) *tetherv1.ExtProcStatus {
	r := st.Rejects
	return &tetherv1.ExtProcStatus{
		OpenStreams: st.OpenStreams,
		Streams:     st.Streams,
		Decisions:   st.Decisions,
		Rejects: map[string]uint64{
			"BadRequest": r.BadRequest, "NotFound": r.NotFound, "Conflict": r.Conflict,
			"TooManyRequests": r.TooManyRequests, "NoCapacity": r.NoCapacity, "NoService": r.NoService,
			"Other": r.Other,
		},
		EngineErrors:         st.EngineErrors,
		ProtocolErrors:       st.ProtocolErrors,
		ServedHostMismatches: st.ServedHostMismatches,
		Draining:             st.Draining,
		SseSessionsLearned:   st.SessionsLearned,
		SseLearnFailures:     st.LearnFailures,
	}
}

// XDSStatus is the snapshot part of an xDS server's publish state and node status.
func XDSStatus(ps xds.PublishStats, nodes []xds.NodeStatus) *tetherv1.XdsStatus {
	out := &tetherv1.XdsStatus{Generation: ps.Generation, Publishes: ps.Publishes, Nacks: ps.NACKs}
	if ps.LastError != nil {
		out.LastError = ps.LastError.Error()
	}
	for _, n := range nodes {
		pn := &tetherv1.XdsNode{Id: n.ID, Cluster: n.Cluster, UserAgent: n.UserAgent, Snapshot: n.Snapshot,
			Streams: int32(n.Streams), LastSeen: ts(n.LastSeen)}
		var lastAck time.Time
		for _, t := range n.Types {
			pn.Types = append(pn.Types, &tetherv1.XdsTypeStatus{TypeUrl: t.TypeURL, SentVersion: t.SentVersion,
				AckedVersion: t.AckedVersion, AckedTime: ts(t.AckedAt)})
			if t.AckedAt.After(lastAck) {
				lastAck = t.AckedAt
			}
		}
		pn.LastAck = ts(lastAck)
		if k := n.LastNACK; k != nil {
			pn.LastNack = &tetherv1.XdsNack{TypeUrl: k.TypeURL, Version: k.Version, Message: k.Message, Time: ts(k.At)}
		}
		out.Nodes = append(out.Nodes, pn)
	}
	return out
}

func ts(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}
