package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/tether-dev/tether/pkg/envoyvalidate"
)

// TestBootstrapEmitsControlPlaneTLS: with tls set, both control-plane clusters carry an
// UpstreamTlsContext trusting envoy.tls.caFile, offering ALPN h2, with SNI and SAN matching
// when envoy.tls.serverName is set and Envoy's client certificate for mutual TLS; the
// bootstrap validates. Without the Envoy-side files the command says what to set.
func TestBootstrapEmitsControlPlaneTLS(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"tls.crt", "tls.key", "ca.crt"} {
		writeFile(t, filepath.Join(dir, f), "x")
	}
	head := "apiVersion: tether/v1\nregistry: {allowedNetworks: [127.0.0.1/32]}\nlisteners: {extProc: 0.0.0.0:9002, xds: 0.0.0.0:18000, api: 127.0.0.1:9000, sip: ''}\n" +
		"services: [{name: web, affinity: cookie, instances: [{id: a, address: 127.0.0.1, ports: {http: 8081}}]}]\n"
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		writeFile(t, p, head+body)
		return p
	}
	mutual := write("mutual.yaml", "tls: {certFile: tls.crt, keyFile: tls.key, clientCAFile: ca.crt}\n"+
		"envoy: {tls: {caFile: /etc/envoy/tether-ca.pem, certFile: /etc/envoy/envoy.pem, keyFile: /etc/envoy/envoy-key.pem, serverName: tether.example}}\n")
	out, err := bootstrapYAML(mutual, "edge-1")
	if err != nil {
		t.Fatal(err)
	}
	if err := envoyvalidate.ValidateBootstrapYAML(out, envoyvalidate.WithClusters("web")); err != nil {
		t.Fatalf("bootstrap with TLS does not validate:\n%v\n%s", err, out)
	}
	b, err := envoyvalidate.ParseBootstrap(out)
	if err != nil {
		t.Fatal(err)
	}
	want := &tlsv3.UpstreamTlsContext{
		Sni: "tether.example",
		CommonTlsContext: &tlsv3.CommonTlsContext{
			AlpnProtocols: []string{"h2"},
			TlsCertificates: []*tlsv3.TlsCertificate{{
				CertificateChain: filename("/etc/envoy/envoy.pem"),
				PrivateKey:       filename("/etc/envoy/envoy-key.pem"),
			}},
		},
	}
	clusters := 0
	for _, c := range b.GetStaticResources().GetClusters() {
		ts := c.GetTransportSocket()
		if ts.GetName() != "envoy.transport_sockets.tls" {
			t.Errorf("cluster %s: transport socket %q", c.GetName(), ts.GetName())
			continue
		}
		var got tlsv3.UpstreamTlsContext
		if err := ts.GetTypedConfig().UnmarshalTo(&got); err != nil {
			t.Fatal(err)
		}
		v := got.GetCommonTlsContext().GetValidationContext()
		if v.GetTrustedCa().GetFilename() != "/etc/envoy/tether-ca.pem" || len(v.GetMatchTypedSubjectAltNames()) != 1 ||
			v.GetMatchTypedSubjectAltNames()[0].GetMatcher().GetExact() != "tether.example" {
			t.Errorf("cluster %s: validation context %v", c.GetName(), v)
		}
		got.CommonTlsContext.ValidationContextType = nil
		if d := cmp.Diff(want, &got, protocmp.Transform()); d != "" {
			t.Errorf("cluster %s: UpstreamTlsContext (-want +got):\n%s", c.GetName(), d)
		}
		clusters++
	}
	if clusters != 2 {
		t.Errorf("%d control-plane clusters with TLS, want 2 (ext_proc and xds)", clusters)
	}

	for name, tc := range map[string]struct{ body, want string }{
		"no CA for Envoy": {"tls: {certFile: tls.crt, keyFile: tls.key}\n", "set envoy.tls.caFile"},
		"mutual TLS without Envoy's certificate": {"tls: {certFile: tls.crt, keyFile: tls.key, clientCAFile: ca.crt}\nenvoy: {tls: {caFile: /ca.pem}}\n",
			"set envoy.tls.certFile and envoy.tls.keyFile"},
	} {
		t.Run(name, func(t *testing.T) {
			p := write(strings.ReplaceAll(name, " ", "-")+".yaml", tc.body)
			if _, err := bootstrapYAML(p, "edge-1"); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("bootstrap = %v; want an error saying %q", err, tc.want)
			}
		})
	}
	// Without tls the clusters stay plain text, as before.
	plain := filepath.Join(dir, "plain.yaml")
	writeFile(t, plain, strings.Replace(head, "sip: ''}", "sip: '', allowInsecure: true}", 1))
	out, err = bootstrapYAML(plain, "edge-1")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "transport_socket") {
		t.Error("a bootstrap without tls has a transport socket")
	}
	_ = os.Remove(plain)
}

func filename(p string) *corev3.DataSource {
	return &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: p}}
}
