package xds_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tether-dev/tether/pkg/xds"
)

// TestNodeTableIsBounded is the regression test for issue 25's finding 5 on xDS: a client that
// connects under ever new node ids (the attack kept 10,000 for an hour, a 5.6 MB /v1/status)
// leaves at most MaxIdleNodes of them in Status, the most recent; a node id or cluster over
// MaxNodeIDLength is refused with InvalidArgument and not recorded.
func TestNodeTableIsBounded(t *testing.T) {
	f := start(t, baseServices(), baseInstances())
	ads := discoveryv3.NewAggregatedDiscoveryServiceClient(f.conn)
	// 1,300 streams one after another: under -race on a loaded 2-core machine that alone took
	// 9 s, so this bound is the test's overall limit, not waitCtx's 10 s.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	one := func(id, cluster string) error {
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		st, err := ads.StreamAggregatedResources(sctx)
		if err != nil {
			return err
		}
		if err := st.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: id, Cluster: cluster}, TypeUrl: resource.ClusterType}); err != nil {
			return err
		}
		_, err = st.Recv()
		return err
	}
	n := xds.MaxIdleNodes + 300
	for i := range n {
		if err := one(fmt.Sprintf("fake-%05d", i), "c"); err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
	}
	// The streams' cancellation reaches the server asynchronously: wait for all to close.
	got := waitStatus(t, f.srv, func(st []xds.NodeStatus) bool {
		for _, s := range st {
			if s.Streams > 0 {
				return false
			}
		}
		return len(st) <= xds.MaxIdleNodes && len(st) > 0
	})
	if len(got) != xds.MaxIdleNodes {
		t.Errorf("%d nodes kept after %d came and went, want %d", len(got), n, xds.MaxIdleNodes)
	}
	if last := got[len(got)-1].ID; last != fmt.Sprintf("fake-%05d", n-1) {
		t.Errorf("the newest node %q was forgotten (last kept %q)", fmt.Sprintf("fake-%05d", n-1), last)
	}
	for _, tc := range []struct{ id, cluster string }{
		{strings.Repeat("x", xds.MaxNodeIDLength+1), "c"},
		{"long-cluster", strings.Repeat("c", xds.MaxNodeIDLength+1)},
	} {
		if err := one(tc.id, tc.cluster); status.Code(err) != codes.InvalidArgument {
			t.Errorf("node id of %d bytes, cluster of %d: %v, want InvalidArgument", len(tc.id), len(tc.cluster), err)
		}
	}
	for _, s := range f.srv.Status() {
		if len(s.ID) > xds.MaxNodeIDLength || s.ID == "long-cluster" {
			t.Errorf("refused node %.20q… recorded", s.ID)
		}
	}
}
