package registry_test

import (
	"fmt"
	"testing"

	"github.com/tether-dev/tether/pkg/registry"
)

// BenchmarkSetHealth flips one instance's health in a registry of 1,000 services × 10
// instances (the xDS benchmark's size): the cost every health verdict pays before xDS sees it.
func BenchmarkSetHealth(b *testing.B) {
	var svcs []registry.Service
	var ins []registry.Instance
	for s := range 1000 {
		name := fmt.Sprintf("svc-%04d", s)
		svcs = append(svcs, registry.Service{Name: name})
		for i := range 10 {
			ins = append(ins, registry.Instance{Service: name, ID: fmt.Sprintf("i%d", i), Address: "10.0.0.1", HTTPPort: 8000 + i, State: registry.StateActive})
		}
	}
	reg := registry.New()
	if err := reg.Apply(svcs, ins); err != nil {
		b.Fatal(err)
	}
	k := registry.Key{Service: "svc-0500", ID: "i5"}
	health := []registry.Health{registry.HealthUnhealthy, registry.HealthHealthy}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if changed, err := reg.SetHealth(k, health[i%2]); err != nil || !changed {
			b.Fatalf("SetHealth: changed=%v err=%v", changed, err)
		}
	}
}
