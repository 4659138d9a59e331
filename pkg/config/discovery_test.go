package config_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-dev/tether/pkg/config"
)

func TestDiscoveryErrors(t *testing.T) {
	yaml := `apiVersion: tether/v1
services:
- name: a
  discovery:
    kubernetes: {namespace: shop, service: web}
    dns: {name: web.example, ports: {http: 80}}
- name: b
  match: {pathPrefix: /b}
  discovery:
    kubernetes:
      namespace: Shop_1
      service: web
      selector: app=web
      ports: {http: "", sip: ""}
- name: c
  match: {pathPrefix: /c}
  discovery:
    kubernetes: {namespace: shop, selector: "app=web,=x"}
- name: d
  match: {pathPrefix: /d}
  discovery:
    xds: {}
- name: e
  match: {pathPrefix: /e}
  discovery:
    dns:
      name: "-bad-"
      type: MX
- name: f
  match: {pathPrefix: /f}
  discovery:
    dns:
      name: _sip._udp.example.com
      type: SRV
      ports: {http: 80}
      server: ns.example:53
      minRefresh: 10ms
- name: g
  match: {pathPrefix: /g}
  discovery:
    dns: {name: web.example}
`
	_, err := config.Parse([]byte(yaml), "tether.yaml")
	want := []string{
		`tether.yaml:4: services[0].discovery: give one of kubernetes, xds, dns, not kubernetes and dns`,
		`tether.yaml:11: services[1].discovery.kubernetes.namespace: "Shop_1" is not a namespace name`,
		`tether.yaml:13: services[1].discovery.kubernetes.selector: give service or selector, not both`,
		`tether.yaml:14: services[1].discovery.kubernetes.ports: name at least one of http, sip`,
		`tether.yaml:18: services[2].discovery.kubernetes.selector: "app=web,=x": "" is not a label key`,
		`tether.yaml:22: services[3].discovery.xds.cluster: required`,
		`tether.yaml:22: services[3].discovery.xds: needs discovery.xds.server (the ADS server to subscribe to)`,
		`tether.yaml:26: services[4].discovery.dns.ports: an A or AAAA source needs ports.http or ports.sip`,
		`tether.yaml:27: services[4].discovery.dns.name: "-bad-" is not a DNS name`,
		`tether.yaml:28: services[4].discovery.dns.type: "MX" is not one of A, AAAA, SRV`,
		`tether.yaml:35: services[5].discovery.dns.ports: SRV records carry the port; leave ports out`,
		`tether.yaml:36: services[5].discovery.dns.server: "ns.example:53": the DNS server must be an IP address`,
		`tether.yaml:37: services[5].discovery.dns.minRefresh: 10ms is out of range 100ms..1h`,
		`tether.yaml:41: services[6].discovery.dns.ports: an A or AAAA source needs ports.http or ports.sip`,
	}
	if diff := cmp.Diff(want, errorLines(t, err)); diff != "" {
		t.Errorf("errors (-want +got):\n%s", diff)
	}
}

func TestDiscoveryValid(t *testing.T) {
	yaml := `apiVersion: tether/v1
discovery:
  kubernetes: {kubeconfig: kube/config}
  xds: {server: 127.0.0.1:15010}
services:
- name: web
  discovery:
    kubernetes: {namespace: shop, service: web, ports: {sip: sip}}
- name: mesh
  match: {pathPrefix: /mesh}
  discovery:
    xds: {cluster: "outbound|80||mesh.shop.svc.cluster.local"}
- name: dns
  match: {pathPrefix: /dns}
  discovery:
    dns: {name: _http._tcp.web.example., type: SRV, server: "127.0.0.1:5353"}
- name: static
  match: {pathPrefix: /static}
`
	c, err := config.Parse([]byte(yaml), "/etc/tether/tether.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.Discovery.Kubernetes.Kubeconfig, filepath.FromSlash("/etc/tether/kube/config"); got != want {
		t.Errorf("kubeconfig %q, want %q (resolved against the config's directory)", got, want)
	}
	got := []config.ServiceDiscovery{}
	for _, s := range c.Services {
		got = append(got, s.Discovery)
	}
	def := func(f func(*config.ServiceDiscovery)) config.ServiceDiscovery {
		sd := config.ServiceDiscovery{
			Kubernetes: config.KubernetesSource{Ports: config.PortNames{HTTP: "http"}},
			DNS:        config.DNSSource{Type: "A", MinRefresh: time.Second, MaxRefresh: 5 * time.Minute},
		}
		f(&sd)
		return sd
	}
	want := []config.ServiceDiscovery{
		def(func(sd *config.ServiceDiscovery) {
			sd.Kind = config.DiscoveryKubernetes
			sd.Kubernetes = config.KubernetesSource{Namespace: "shop", Service: "web", Ports: config.PortNames{HTTP: "http", SIP: "sip"}}
		}),
		def(func(sd *config.ServiceDiscovery) {
			sd.Kind = config.DiscoveryXDS
			sd.XDS.Cluster = "outbound|80||mesh.shop.svc.cluster.local"
		}),
		def(func(sd *config.ServiceDiscovery) {
			sd.Kind = config.DiscoveryDNS
			sd.DNS.Name, sd.DNS.Type, sd.DNS.Server = "_http._tcp.web.example.", "SRV", "127.0.0.1:5353"
		}),
		def(func(*config.ServiceDiscovery) {}),
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("discovery (-want +got):\n%s", diff)
	}
}

func TestGatewayAPIDiscovery(t *testing.T) {
	c, err := config.Parse([]byte(`apiVersion: tether/v1
discovery:
  gatewayAPI:
    enabled: true
    gatewayClasses: [eg, internal.example.com]
    routeSelector: tether.dev/persist=yes
`), "tether.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := config.GatewayAPISource{Enabled: true, GatewayClasses: []string{"eg", "internal.example.com"},
		RouteSelector: "tether.dev/persist=yes", ControllerName: config.DefaultGatewayControllerName}
	if diff := cmp.Diff(want, c.Discovery.GatewayAPI); diff != "" {
		t.Errorf("gatewayAPI (-want +got):\n%s", diff)
	}

	_, err = config.Parse([]byte(`apiVersion: tether/v1
discovery:
  gatewayAPI:
    enabled: true
    gatewayClasses: [Bad_Class]
    routeSelector: "=x"
    namespace: Shop
    controllerName: tether
`), "tether.yaml")
	wantErrs := []string{
		`tether.yaml:5: discovery.gatewayAPI.gatewayClasses[0]: "Bad_Class" is not a GatewayClass name`,
		`tether.yaml:6: discovery.gatewayAPI.routeSelector: "=x": "" is not a label key`,
		`tether.yaml:7: discovery.gatewayAPI.namespace: "Shop" is not a namespace name`,
		`tether.yaml:8: discovery.gatewayAPI.controllerName: "tether" is not a controller name (domain/path, e.g. tether.dev/session-persistence)`,
	}
	if diff := cmp.Diff(wantErrs, errorLines(t, err)); diff != "" {
		t.Errorf("errors (-want +got):\n%s", diff)
	}

	_, err = config.Parse([]byte(`apiVersion: tether/v1
discovery:
  gatewayAPI:
    gatewayClasses: [eg]
`), "tether.yaml")
	_, err2 := config.Parse([]byte(`apiVersion: tether/v1
discovery:
  gatewayAPI: {enabled: true}
`), "tether.yaml")
	wantErrs = []string{`tether.yaml:4: discovery.gatewayAPI.gatewayClasses: has no effect without discovery.gatewayAPI.enabled: true`,
		`tether.yaml:3: discovery.gatewayAPI: give gatewayClasses or routeSelector: which HTTPRoutes are tether's`}
	if diff := cmp.Diff(wantErrs, append(errorLines(t, err), errorLines(t, err2)...)); diff != "" {
		t.Errorf("errors (-want +got):\n%s", diff)
	}
}

func TestXDSTLSErrors(t *testing.T) {
	_, err := config.Parse([]byte(`apiVersion: tether/v1
discovery:
  xds:
    server: istiod.istio-system:15012
    tls:
      caFile: /nonexistent/ca.pem
      certFile: client.pem
      serverName: istiod.istio-system.svc
`), "/etc/tether/tether.yaml")
	want := []string{
		`/etc/tether/tether.yaml:5: discovery.xds.tls: set both certFile and keyFile, or neither`,
		`/etc/tether/tether.yaml:6: discovery.xds.tls.caFile: set discovery.xds.tls.enabled: true to use it`,
		`/etc/tether/tether.yaml:7: discovery.xds.tls.certFile: set discovery.xds.tls.enabled: true to use it`,
		`/etc/tether/tether.yaml:8: discovery.xds.tls.serverName: set discovery.xds.tls.enabled: true to use it`,
	}
	if diff := cmp.Diff(want, errorLines(t, err)); diff != "" {
		t.Errorf("errors (-want +got):\n%s", diff)
	}
}

func TestXDSTLSValid(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"ca.pem", "client.pem", "client-key.pem"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c, err := config.Parse([]byte(`apiVersion: tether/v1
discovery:
  xds:
    server: istiod.istio-system:15012
    tls: {enabled: true, caFile: ca.pem, certFile: client.pem, keyFile: client-key.pem, serverName: istiod.istio-system.svc}
`), filepath.Join(dir, "tether.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	want := config.XDSTLS{Enabled: true, CAFile: filepath.Join(dir, "ca.pem"), CertFile: filepath.Join(dir, "client.pem"),
		KeyFile: filepath.Join(dir, "client-key.pem"), ServerName: "istiod.istio-system.svc"}
	if diff := cmp.Diff(want, c.Discovery.XDS.TLS); diff != "" {
		t.Errorf("tls (-want +got; paths resolved against the config's directory):\n%s", diff)
	}
	_, err = config.Parse([]byte(`apiVersion: tether/v1
discovery:
  xds:
    tls: {enabled: true, caFile: missing.pem}
`), filepath.Join(dir, "tether.yaml"))
	if got := errorLines(t, err); len(got) != 1 || !strings.Contains(got[0], "discovery.xds.tls.caFile: cannot read") {
		t.Errorf("errors %q, want the unreadable caFile", got)
	}
}
