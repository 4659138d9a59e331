package status_test

import (
	"testing"

	"github.com/tether-dev/tether/pkg/affinity"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/status"
)

// TestActualCountsAStandbyInUse: a standby instance holding sessions (scale-out put them there)
// is an instance in use, counted in actual like the active ones; an empty standby is not.
func TestActualCountsAStandbyInUse(t *testing.T) {
	svc := affinitytest.Service("web", registry.AffinityCookie)
	svc.SessionsPerInstance = 2
	insts := affinitytest.Instances("web", 3)
	insts[1].State, insts[2].State = registry.StateStandby, registry.StateStandby
	f := affinitytest.New(t, []registry.Service{svc}, insts)
	a := status.New(f.Registry, f.Engine)
	actual := func() int32 { return a.Snapshot().GetServices()[0].GetActualInstances() }
	if got := actual(); got != 1 {
		t.Fatalf("actual %d with one active instance and two empty standbys, want 1", got)
	}
	for range 3 { // i1 full, then one session on the standby i2
		if _, err := f.Engine.CreateSession(t.Context(), "web", affinity.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if got := actual(); got != 2 {
		t.Errorf("actual %d with the standby i2 holding a session, want 2 (i1 and i2; i3 is empty)", got)
	}
}
