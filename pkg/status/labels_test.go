package status_test

import (
	"testing"
	"time"

	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/calls"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/status"
)

// TestNoLabelATargetLabelTakes: no label of any tether metric has a name Prometheus (instance,
// job) or the Prometheus Operator (service, namespace, pod, container, endpoint) attaches to
// scraped series — such a label would be overwritten by the target's. Every family tether
// renders is gathered, with calls, streams, sources and events present.
func TestNoLabelATargetLabelTakes(t *testing.T) {
	web := affinitytest.Service("web", registry.AffinityCookie)
	voice := affinitytest.Service("voice", registry.AffinityHash)
	mcp := affinitytest.Service("mcp", registry.AffinityMCPStreamable)
	mcp.StreamsPerInstance = 2
	insts := append(append(affinitytest.Instances("web", 1), affinitytest.Instances("voice", 1)...), affinitytest.Instances("mcp", 1)...)
	insts[1].SIPPort = 5070
	f := affinitytest.New(t, []registry.Service{web, voice, mcp}, insts)
	tr := calls.New()
	tr.SetCap("voice", 3)
	if _, err := tr.Begin("voice", "i1", "c"); err != nil {
		t.Fatal(err)
	}
	events := status.NewEvents(nil, nil)
	events.ScanScaleIn(f.Registry, f.Engine, 0)
	a := status.New(f.Registry, f.Engine, status.WithEvents(events), status.WithCalls(tr.Loads),
		status.WithExtProc(func() *tetherv1.ExtProcStatus {
			return &tetherv1.ExtProcStatus{Rejects: map[string]uint64{"NoCapacity": 1}}
		}),
		status.WithXDS(func() *tetherv1.XdsStatus { return &tetherv1.XdsStatus{} }))
	m := status.NewMetrics(a, events, nil)
	m.ObserveDecision("web", registry.AffinityCookie, "admitted", time.Millisecond)
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	reserved := map[string]bool{"instance": true, "job": true, "service": true, "namespace": true, "pod": true, "container": true, "endpoint": true}
	seen := map[string]bool{}
	for _, fam := range fams {
		for _, mt := range fam.GetMetric() {
			for _, l := range mt.GetLabel() {
				seen[l.GetName()] = true
				if reserved[l.GetName()] {
					t.Errorf("%s has the label %q, which a scrape's target label overwrites", fam.GetName(), l.GetName())
				}
			}
		}
	}
	for _, want := range []string{status.LabelService, status.LabelInstance} {
		if !seen[want] {
			t.Errorf("no metric carries %s (labels seen: %v)", want, seen)
		}
	}
}
