// Package statustest holds fixtures for tests of what reads tether's metrics (alert rules,
// dashboards): the set of metric family names tether exports.
package statustest

import (
	"testing"
	"time"

	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/status"
)

// MetricNames returns the names of every metric family a tether with ext_proc and xDS on
// exports (histograms by their base name), gathered from a real status.Metrics over a real
// engine with one decision observed and one scale event counted.
func MetricNames(t testing.TB) map[string]bool {
	t.Helper()
	f := affinitytest.New(t, []registry.Service{affinitytest.Service("web", registry.AffinityCookie)}, affinitytest.Instances("web", 2))
	events := status.NewEvents(nil, nil)
	events.ScanScaleIn(f.Registry, f.Engine, time.Minute)
	a := status.New(f.Registry, f.Engine, status.WithEvents(events),
		status.WithExtProc(func() *tetherv1.ExtProcStatus {
			return &tetherv1.ExtProcStatus{Rejects: map[string]uint64{"NoCapacity": 0}}
		}),
		status.WithXDS(func() *tetherv1.XdsStatus { return &tetherv1.XdsStatus{} }))
	m := status.NewMetrics(a, events, nil)
	m.ObserveDecision("web", registry.AffinityCookie, "admitted", time.Millisecond)
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{"tether_scale_events_total": true} // counted only once an event happened
	for _, fam := range fams {
		out[fam.GetName()] = true
	}
	return out
}
