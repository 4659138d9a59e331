// Package grpc holds the proxyless-gRPC recipe (bootstrap.json); its test runs it.
package grpc_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	grpcxds "google.golang.org/grpc/xds"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/xds"
)

// bootstrapFile is gRFC A27's bootstrap, the fields the recipe uses.
type bootstrapFile struct {
	XDSServers []struct {
		ServerURI    string `json:"server_uri"`
		ChannelCreds []struct {
			Type   string          `json:"type"`
			Config json.RawMessage `json:"config,omitempty"`
		} `json:"channel_creds"`
		ServerFeatures []string `json:"server_features"`
	} `json:"xds_servers"`
	Node json.RawMessage `json:"node"`
	// AllowedGRPCServices (gRFC A102): the side channels tether's xDS may point the client's
	// ext_proc filter at, with their credentials.
	AllowedGRPCServices map[string]struct {
		ChannelCreds []struct {
			Type   string          `json:"type"`
			Config json.RawMessage `json:"config,omitempty"`
		} `json:"channel_creds"`
	} `json:"allowed_grpc_services"`
}

// TestBootstrapRecipe decodes bootstrap.json strictly (its node into go-control-plane's
// core.v3.Node), checks tether classifies that node as a proxyless gRPC client, then hands the
// file — pointed at a tether xDS server on loopback — to grpc-go's own xDS resolver, whose RPCs
// must reach the service's instance.
func TestBootstrapRecipe(t *testing.T) {
	data, err := os.ReadFile("bootstrap.json")
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var bf bootstrapFile
	if err := dec.Decode(&bf); err != nil {
		t.Fatalf("bootstrap.json: %v", err)
	}
	var node corev3.Node
	if err := protojson.Unmarshal(bf.Node, &node); err != nil {
		t.Fatalf("node does not decode strictly into core.v3.Node: %v", err)
	}
	if len(bf.XDSServers) != 1 || !strings.HasSuffix(bf.XDSServers[0].ServerURI, ":18000") || bf.XDSServers[0].ServerFeatures[0] != "xds_v3" {
		t.Fatalf("xds_servers = %+v, want tether's ADS port 18000 with xds_v3", bf.XDSServers)
	}

	// One service with one instance: a real gRPC server naming itself in a header.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	be := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if err := grpc.SetHeader(ctx, metadata.Pairs("backend", "web-1")); err != nil {
			return nil, err
		}
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(be, health.NewServer())
	go func() { _ = be.Serve(lis) }()
	t.Cleanup(be.Stop)
	reg := registry.New()
	if err := reg.Apply([]registry.Service{{Name: "web"}}, []registry.Instance{
		{Service: "web", ID: "web-1", Address: "127.0.0.1", HTTPPort: lis.Addr().(*net.TCPAddr).Port, Weight: 1, State: registry.StateActive},
	}); err != nil {
		t.Fatal(err)
	}
	srv := xds.NewServer(reg, xds.WithDebounce(0))
	if got := srv.NodeProfile(&node); got.Kind != xds.KindGRPC {
		t.Errorf("the recipe's node gets profile %v, want %v", got.Kind, xds.KindGRPC)
	}
	xlis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, xlis) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	var raw map[string]any
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	raw["xds_servers"].([]any)[0].(map[string]any)["server_uri"] = "passthrough:///" + xlis.Addr().String()
	local, err := json.Marshal(raw)
	if err != nil {
		t.Fatal(err)
	}
	res, err := grpcxds.NewXDSResolverWithConfigForTesting(local)
	if err != nil {
		t.Fatalf("grpc-go refuses the bootstrap: %v", err)
	}
	cc, err := grpc.NewClient("xds:///web", grpc.WithResolvers(res), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cc.Close() }()
	var hdr metadata.MD
	if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&hdr), grpc.WaitForReady(true)); err != nil {
		t.Fatalf("RPC through the recipe's bootstrap: %v", err)
	}
	if got := hdr.Get("backend"); len(got) != 1 || got[0] != "web-1" {
		t.Errorf("served by %v, want web-1", got)
	}
}
