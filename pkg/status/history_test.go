package status_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-dev/tether/pkg/status"
)

// TestHistoryKeepsTheWindow: each sample holds every service's counts at its time, the ring
// keeps window/step+1 samples (oldest dropped), Samples ends with one taken now, and a sample
// does not change after the counts do.
func TestHistoryKeepsTheWindow(t *testing.T) {
	o := status.NewOutcomes()
	now := time.Unix(1000, 0)
	h := status.NewHistory(o, 30*time.Second, 10*time.Second, func() time.Time { return now })
	var want []status.Sample
	for i := range 6 {
		o.Add("web", "NoCapacity")
		if i%2 == 0 {
			o.Add("api", "TooManyRequests")
		}
		h.Record()
		want = append(want, status.Sample{Time: now, Decisions: o.All()})
		now = now.Add(10 * time.Second)
	}
	o.Add("web", "NoCapacity") // since the last step: in the sample taken now only
	want = append(want[2:], status.Sample{Time: now, Decisions: o.All()})
	got := h.Samples()
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("samples (-want +got):\n%s", diff)
	}
	if n := got[len(got)-2].Decisions["web"]["NoCapacity"]; n != 6 {
		t.Errorf("last recorded web NoCapacity = %d, want 6", n)
	}
	o.Add("web", "NoCapacity")
	if n := h.Samples()[3].Decisions["web"]["NoCapacity"]; n != 6 {
		t.Errorf("a recorded sample changed with the counts: %d", n)
	}
	if h.Step() != 10*time.Second {
		t.Errorf("step %v", h.Step())
	}
}
