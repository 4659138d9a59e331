package affinity_test

import (
	"context"
	"testing"

	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/registry"
)

// TestRequestsNeverRebuildTheView: Decide routes by the published view; a new registry
// generation reaches requests when Run (or Sync) applies it, never on the request's goroutine.
func TestRequestsNeverRebuildTheView(t *testing.T) {
	svc := affinitytest.Service("web", registry.AffinityNone)
	f := affinitytest.New(t, []registry.Service{svc}, affinitytest.Instances("web", 1), affinitytest.WithoutRun())
	extra := affinitytest.Instances("web", 2)[1]
	if err := f.Registry.Register(extra); err != nil {
		t.Fatal(err)
	}
	if err := f.Registry.Deregister(registry.Key{Service: "web", ID: "i1"}); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		d := mustDecide(t, f, affinitytest.HTTP("web", "GET", "/"))
		if id := d.Instance().ID; id != "i1" {
			t.Fatalf("a request saw the new generation (routed to %s) before Run or Sync applied it", id)
		}
		d.End()
	}
	if err := f.Engine.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		d := mustDecide(t, f, affinitytest.HTTP("web", "GET", "/"))
		if id := d.Instance().ID; id != "i2" {
			t.Fatalf("after Sync routed to %s, want i2", id)
		}
		d.End()
	}
}
