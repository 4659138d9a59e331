package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-dev/tether/pkg/config"
	"github.com/tether-dev/tether/pkg/envoyvalidate"
)

// TestShippedBootstrapIsGenerated keeps envoy/bootstrap.yaml equal to what
// `tether bootstrap -c examples/quickstart/tether.yaml` prints (run from the repository root).
func TestShippedBootstrapIsGenerated(t *testing.T) {
	t.Chdir("../..")
	const cfgPath = "examples/quickstart/tether.yaml"
	code, stdout, stderr := runCmd(t, "bootstrap", "-c", cfgPath)
	if code != 0 {
		t.Fatalf("tether bootstrap exited %d: %s", code, stderr)
	}
	want, err := os.ReadFile("envoy/bootstrap.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(string(want), stdout); d != "" {
		t.Errorf("envoy/bootstrap.yaml is stale; regenerate with\n  go run ./cmd/tether bootstrap -c %s > envoy/bootstrap.yaml\n(-file +generated):\n%s", cfgPath, d)
	}
}

func TestBootstrapOutputValidates(t *testing.T) {
	cfg := `apiVersion: tether/v1
registry: {allowedNetworks: [127.0.0.1/32]}
listeners: {extProc: "0.0.0.0:9002", xds: "tether.internal:18000", api: "127.0.0.1:9000", allowInsecure: true}
extProc: {messageTimeout: 250ms, destinationHeader: x-dest}
envoy: {managedListeners: MANAGED, listenerAddress: "127.0.0.1:8080", adminAddress: "127.0.0.1:19901"}
services:
- name: web
  match: {authorities: [web.test]}
  affinity: cookie
  upstream: {protocol: http2}
  instances: [{id: a, address: 127.0.0.1, ports: {http: 8081}}]
- name: mcp
  match: {pathPrefix: /mcp}
  affinity: mcp-streamable
  balancing: consistent-hash
  hashBalanceFactor: 1.5
  maxLifetime: 1h
  instances: [{id: a, address: 127.0.0.1, ports: {http: 8091}}]
`
	for _, managed := range []string{"false", "true"} {
		t.Run("managedListeners="+managed, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "tether.yaml")
			if err := os.WriteFile(path, []byte(strings.Replace(cfg, "MANAGED", managed, 1)), 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := bootstrapYAML(path, "edge-1")
			if err != nil {
				t.Fatal(err)
			}
			c, err := config.Load(path)
			if err != nil {
				t.Fatal(err)
			}
			var dynamic []string
			for _, s := range c.Services {
				dynamic = append(dynamic, s.Name)
			}
			if err := envoyvalidate.ValidateBootstrapYAML(out, envoyvalidate.WithClusters(dynamic...)); err != nil {
				t.Fatalf("generated bootstrap does not validate:\n%v\n%s", err, out)
			}
			b, err := envoyvalidate.ParseBootstrap(out)
			if err != nil {
				t.Fatal(err)
			}
			if b.GetNode().GetId() != "edge-1" {
				t.Errorf("node id = %q, want edge-1", b.GetNode().GetId())
			}
			if got := len(b.GetStaticResources().GetListeners()); (managed == "true") != (got == 0) {
				t.Errorf("managed=%s: %d static listeners", managed, got)
			}
			if (managed == "true") != (b.GetDynamicResources().GetLdsConfig() != nil) {
				t.Errorf("managed=%s: lds_config = %v", managed, b.GetDynamicResources().GetLdsConfig())
			}
			wants := []string{"address: tether.internal", "STRICT_DNS", "port_value: 19901"}
			if managed == "false" { // the ext_proc filter is in the static listener
				wants = append(wants, "remove: x-dest", "message_timeout: 0.250s")
			}
			for _, want := range wants {
				if !strings.Contains(string(out), want) {
					t.Errorf("bootstrap lacks %q", want)
				}
			}
			got := map[string]string{}
			for _, c := range b.GetStaticResources().GetClusters() {
				sa := c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
				got[c.GetName()] = fmt.Sprintf("%s %s:%d", c.GetType(), sa.GetAddress(), sa.GetPortValue())
			}
			// 0.0.0.0 (tether listening everywhere) becomes loopback: Envoy runs next to tether.
			if d := cmp.Diff(map[string]string{"tether_ext_proc": "STATIC 127.0.0.1:9002", "tether_xds": "STRICT_DNS tether.internal:18000"}, got); d != "" {
				t.Errorf("static clusters (-want +got):\n%s", d)
			}
		})
	}
}

func TestBootstrapCommandErrors(t *testing.T) {
	noXDS := filepath.Join(t.TempDir(), "tether.yaml")
	if err := os.WriteFile(noXDS, []byte("apiVersion: tether/v1\nregistry: {allowedNetworks: [127.0.0.1/32]}\nlisteners: {extProc: 127.0.0.1:9002, xds: \"\", api: 127.0.0.1:9000}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStderr string
	}{
		{"no -c", []string{"bootstrap"}, 2, "usage: tether bootstrap -c FILE"},
		{"extra argument", []string{"bootstrap", "-c", noXDS, "x"}, 2, "usage: tether bootstrap -c FILE"},
		{"missing file", []string{"bootstrap", "-c", "/nonexistent/t.yaml"}, 1, "tether bootstrap:"},
		{"xds listener off", []string{"bootstrap", "-c", noXDS}, 1, "the bootstrap needs listeners.xds and listeners.extProc"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCmd(t, tt.args...)
			if code != tt.wantCode || stdout != "" || !strings.Contains(stderr, tt.wantStderr) {
				t.Errorf("run(%q) = %d\nstdout:\n%s\nstderr:\n%s\nwant code %d and stderr containing %q", tt.args, code, stdout, stderr, tt.wantCode, tt.wantStderr)
			}
		})
	}
}

// TestBootstrapReplicas: envoy.replicas puts every replica in both control-plane clusters;
// active-standby puts the second at priority 1. The output validates through go-control-plane.
func TestBootstrapReplicas(t *testing.T) {
	for _, mode := range []string{"active-active", "active-standby"} {
		t.Run(mode, func(t *testing.T) {
			cfg := "apiVersion: tether/v1\nregistry: {allowedNetworks: [127.0.0.1/32]}\nenvoy:\n  replicaMode: " + mode + "\n  replicas:\n" +
				"  - {xds: '10.0.0.1:18000', extProc: '10.0.0.1:9002'}\n" +
				"  - {xds: 'tether-b.internal:18000', extProc: 'tether-b.internal:9002'}\n" +
				"services:\n- name: web\n  instances: [{id: a, address: 127.0.0.1, ports: {http: 8081}}]\n"
			path := filepath.Join(t.TempDir(), "tether.yaml")
			if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := bootstrapYAML(path, "edge-1")
			if err != nil {
				t.Fatal(err)
			}
			if err := envoyvalidate.ValidateBootstrapYAML(out, envoyvalidate.WithClusters("web")); err != nil {
				t.Fatalf("generated bootstrap does not validate:\n%v\n%s", err, out)
			}
			b, err := envoyvalidate.ParseBootstrap(out)
			if err != nil {
				t.Fatal(err)
			}
			standbyPriority := uint32(0)
			if mode == "active-standby" {
				standbyPriority = 1
			}
			for _, c := range b.GetStaticResources().GetClusters() {
				var got []string
				for _, l := range c.GetLoadAssignment().GetEndpoints() {
					for _, e := range l.GetLbEndpoints() {
						got = append(got, fmt.Sprintf("%d:%s", l.GetPriority(), e.GetEndpoint().GetAddress().GetSocketAddress().GetAddress()))
					}
				}
				want := []string{"0:10.0.0.1", fmt.Sprintf("%d:tether-b.internal", standbyPriority)}
				if d := cmp.Diff(want, got); d != "" {
					t.Errorf("%s endpoints (-want +got):\n%s", c.GetName(), d)
				}
				if c.GetType().String() != "STRICT_DNS" || len(c.GetHealthChecks()) != 1 || c.GetOutlierDetection() == nil {
					t.Errorf("%s: type %v, health checks %d, outlier detection %v", c.GetName(), c.GetType(), len(c.GetHealthChecks()), c.GetOutlierDetection())
				}
			}
		})
	}
}
