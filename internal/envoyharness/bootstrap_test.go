package envoyharness_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/protobuf/proto"

	"github.com/tether-dev/tether/internal/envoyharness"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/wire"
	"github.com/tether-dev/tether/pkg/xds"
)

// TestExtProcFromBootstrap reads the ext_proc side of bootstraps xds.Bootstrap generates: one
// replica, three active-active, three active-standby; and refuses bootstraps it cannot read
// that way (no static listener: managed listeners; the ext_proc cluster removed).
func TestExtProcFromBootstrap(t *testing.T) {
	services := []registry.Service{{Name: "web", Affinity: registry.AffinityCookie, Match: registry.Match{PathPrefix: "/"}}}
	replicas := []xds.Replica{
		{XDSAddress: "127.0.0.1:7001", ExtProcAddress: "127.0.0.1:7101"},
		{XDSAddress: "127.0.0.1:7002", ExtProcAddress: "127.0.0.1:7102"},
		{XDSAddress: "127.0.0.1:7003", ExtProcAddress: "127.0.0.1:7103"},
	}
	hc := envoyharness.DefaultHealthCheck()
	one := xds.BootstrapParams{XDSAddress: "127.0.0.1:7001", ExtProcAddress: "127.0.0.1:7101", Params: xds.Params{MessageTimeout: 3 * time.Second}}
	for _, tc := range []struct {
		name    string
		bp      xds.BootstrapParams
		drop    bool // remove the ext_proc cluster from the static resources
		want    envoyharness.BootstrapExtProc
		wantErr string
	}{
		{name: "one replica", bp: one, want: envoyharness.BootstrapExtProc{Cluster: xds.ExtProcClusterName, Type: "STATIC",
			Active: []string{"127.0.0.1:7101"}, HealthCheck: &hc, MessageTimeout: 3 * time.Second}},
		{name: "three active-active", bp: xds.BootstrapParams{XDSAddress: "x:1", ExtProcAddress: "x:2", Replicas: replicas},
			want: envoyharness.BootstrapExtProc{Cluster: xds.ExtProcClusterName, Type: "STATIC",
				Active: []string{"127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"}, HealthCheck: &hc, MessageTimeout: wire.DefaultMessageTimeout}},
		{name: "three active-standby", bp: xds.BootstrapParams{XDSAddress: "x:1", ExtProcAddress: "x:2", Replicas: replicas, Standby: true},
			want: envoyharness.BootstrapExtProc{Cluster: xds.ExtProcClusterName, Type: "STATIC",
				Active: []string{"127.0.0.1:7101"}, Standby: []string{"127.0.0.1:7102", "127.0.0.1:7103"}, HealthCheck: &hc, MessageTimeout: wire.DefaultMessageTimeout}},
		{name: "managed listeners: no static ext_proc filter", bp: func() xds.BootstrapParams { p := one; p.ManagedListeners = true; return p }(),
			wantErr: "0 ext_proc filters"},
		{name: "the ext_proc cluster missing", bp: one, drop: true, wantErr: "not among the bootstrap's static clusters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := xds.Bootstrap(services, tc.bp)
			if err != nil {
				t.Fatal(err)
			}
			if tc.drop {
				sr := b.GetStaticResources()
				for i, c := range sr.GetClusters() {
					if c.GetName() == xds.ExtProcClusterName {
						sr.Clusters = append(sr.Clusters[:i], sr.Clusters[i+1:]...)
						break
					}
				}
			}
			got, err := envoyharness.ExtProcFromBootstrap(b)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ExtProcFromBootstrap: %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got.RetryPolicy, xds.ExtProcRetryPolicy()) {
				t.Errorf("retry_policy %v, want xds.ExtProcRetryPolicy's", got.RetryPolicy)
			}
			got.RetryPolicy = nil
			if d := cmp.Diff(tc.want, got, cmpopts.EquateEmpty()); d != "" {
				t.Errorf("ExtProcFromBootstrap (-want +got):\n%s", d)
			}
		})
	}
}
