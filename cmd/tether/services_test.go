package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/tether-dev/tether/internal/testutil"
)

// TestServeRunsEveryListener starts serve with every listener on a free port and talks to
// each one as its real client would: Envoy's ext_proc health check, an ADS stream, Kamailio's
// decision POST and the SessionAPI, whose session then shows up in the instance usage.
func TestServeRunsEveryListener(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tether.yaml")
	writeFile(t, path, testConfig(upstreamPort(t), upstreamPort(t)))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan serveInfo, 1)
	done := make(chan error, 1)
	var logs testutil.SyncBuffer
	go func() {
		done <- serve(ctx, serveOptions{configPath: path, logOut: &logs, reload: make(chan os.Signal),
			ready: func(i serveInfo) { ready <- i }})
	}()
	var info serveInfo
	select {
	case info = <-ready:
	case err := <-done:
		t.Fatalf("serve: %v", err)
	}
	for name, addr := range map[string]string{"extProc": info.extProcAddr, "xds": info.xdsAddr, "sip": info.sipAddr, "api": info.apiAddr} {
		if addr == "" || strings.HasSuffix(addr, ":0") {
			t.Fatalf("%s listener address %q", name, addr)
		}
	}

	t.Run("ext_proc health", func(t *testing.T) {
		conn, err := grpc.NewClient(info.extProcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = conn.Close() }()
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		defer ccancel()
		resp, err := healthpb.NewHealthClient(conn).Check(cctx, &healthpb.HealthCheckRequest{Service: "envoy.service.ext_proc.v3.ExternalProcessor"})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health = %v, %v; want SERVING", resp, err)
		}
	})

	t.Run("ads serves the web cluster", func(t *testing.T) {
		conn, err := grpc.NewClient(info.xdsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = conn.Close() }()
		sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
		defer scancel()
		stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(sctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "test-envoy"}, TypeUrl: resourcev3.ClusterType}); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetTypeUrl() != resourcev3.ClusterType || len(resp.GetResources()) != 1 {
			t.Fatalf("CDS response = %v", resp)
		}
		// The operator endpoint lists the node that just connected.
		waitFor(t, "node status", func() bool {
			code, body := get(t, "http://"+info.apiAddr+"/v1/xds/nodes")
			return code == http.StatusOK && strings.Contains(body, "test-envoy")
		})
	})

	t.Run("sip decision endpoint", func(t *testing.T) {
		invite := "INVITE sip:bob@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:5060;branch=z9hG4bK1\r\n" +
			"From: <sip:alice@example.com>;tag=1\r\nTo: <sip:bob@example.com>\r\nCall-ID: c1\r\nCSeq: 1 INVITE\r\n" +
			"Max-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
		resp, err := http.Post("http://"+info.sipAddr+"/v1/sip/nosuch/decide", "application/sip", strings.NewReader(invite))
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("unknown service: status %d, want 404", resp.StatusCode)
		}
	})

	t.Run("session api reaches the engine", func(t *testing.T) {
		resp, err := testutil.PostJSON("http://"+info.apiAddr+"/v1/services/web/sessions", "{}")
		if err != nil {
			t.Fatal(err)
		}
		var created struct {
			ID, Instance string
		}
		err = json.NewDecoder(resp.Body).Decode(&created)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || err != nil || created.ID == "" || created.Instance == "" {
			t.Fatalf("create: %d %+v %v", resp.StatusCode, created, err)
		}
		usage, err := info.engine.Usage("web")
		if err != nil {
			t.Fatal(err)
		}
		total := 0
		for _, u := range usage {
			total += u.Sessions
		}
		if total != 1 {
			t.Fatalf("engine counts %d sessions, want the one created through the API", total)
		}
	})

	t.Run("metrics", func(t *testing.T) {
		// The session created above holds one session slot on web's first instance.
		code, body := get(t, "http://"+info.apiAddr+"/metrics")
		if code != http.StatusOK {
			t.Fatalf("/metrics: %d %s", code, body)
		}
		for _, want := range []string{
			"# TYPE tether_extproc_decisions_total counter\ntether_extproc_decisions_total 0\n",
			`tether_extproc_rejects_total{class="TooManyRequests"} 0`,
			`tether_service_desired_instances{tether_service="web"} 1`,
			`tether_instance_sessions{tether_instance="i0",tether_service="web"} 1`,
			`tether_instance_session_slots{tether_instance="i0",tether_service="web"} 20`,
			`tether_instance_requests{tether_instance="i1",tether_service="web"} 0`,
			"tether_xds_publish_failing 0\n",
		} {
			if !strings.Contains(body, want) {
				t.Errorf("/metrics lacks %q:\n%s", want, body)
			}
		}
	})

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("serve: %v\n%s", err, logs.String())
	}
}
