// Package envoygateway holds the Envoy Gateway recipe; deploy/recipetest decodes it into Envoy
// Gateway's own types (a module of its own) and checks Envoy Gateway's translation of it (make
// check-recipes); this test holds its values to tether's filter contract.
package envoygateway_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"

	"github.com/tether-dev/tether/pkg/wire"
)

type circuitBreaker struct {
	MaxConnections      uint32 `yaml:"maxConnections"`
	MaxPendingRequests  uint32 `yaml:"maxPendingRequests"`
	MaxParallelRequests uint32 `yaml:"maxParallelRequests"`
}

// limit is the breakers' common value, 0 when they differ.
func (c circuitBreaker) limit() uint32 {
	if c.MaxConnections == c.MaxPendingRequests && c.MaxConnections == c.MaxParallelRequests {
		return c.MaxConnections
	}
	return 0
}

type recipeDoc struct {
	Kind string `yaml:"kind"`
	Spec struct {
		ExtProc []struct {
			MessageTimeout string `yaml:"messageTimeout"`
			FailOpen       bool   `yaml:"failOpen"`
			StatusOnError  int    `yaml:"statusOnError"`
			ProcessingMode struct {
				Request struct {
					Body       string   `yaml:"body"`
					Attributes []string `yaml:"attributes"`
				} `yaml:"request"`
				Response struct {
					Body string `yaml:"body"`
				} `yaml:"response"`
			} `yaml:"processingMode"`
			Metadata struct {
				Writable   []string `yaml:"writableNamespaces"`
				Accessible []string `yaml:"accessibleNamespaces"`
			} `yaml:"metadata"`
			BackendSettings struct {
				CircuitBreaker circuitBreaker `yaml:"circuitBreaker"`
				HealthCheck    struct {
					Active struct {
						Type string `yaml:"type"`
						GRPC struct {
							Service string `yaml:"service"`
						} `yaml:"grpc"`
						Interval           string `yaml:"interval"`
						Timeout            string `yaml:"timeout"`
						UnhealthyThreshold uint32 `yaml:"unhealthyThreshold"`
						HealthyThreshold   uint32 `yaml:"healthyThreshold"`
					} `yaml:"active"`
				} `yaml:"healthCheck"`
				HTTP2 struct {
					ConnectionKeepalive struct {
						Interval string `yaml:"interval"`
						Timeout  string `yaml:"timeout"`
					} `yaml:"connectionKeepalive"`
				} `yaml:"http2"`
			} `yaml:"backendSettings"`
		} `yaml:"extProc"`
		CircuitBreaker circuitBreaker `yaml:"circuitBreaker"`
		LoadBalancer   struct {
			EndpointOverride struct {
				ExtractFrom []struct {
					Header string `yaml:"header"`
				} `yaml:"extractFrom"`
			} `yaml:"endpointOverride"`
		} `yaml:"loadBalancer"`
		Headers struct {
			EarlyRequestHeaders struct {
				Remove []string `yaml:"remove"`
			} `yaml:"earlyRequestHeaders"`
		} `yaml:"headers"`
	} `yaml:"spec"`
}

func duration(t *testing.T, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Errorf("duration %q: %v", s, err)
	}
	return d
}

// TestRecipeFollowsTheFilterContract: every value of tether.yaml that tether depends on is the
// filter contract's (wire.FilterContract, which tether's own bootstrap and xDS follow too): the
// full-duplex modes (Envoy Gateway's only way to response trailers), timeout, fail closed,
// status on error, attributes, namespaces, the ext_proc cluster's breakers, health check and
// keepalive, the backend's breakers, and the destination header (override and early removal).
func TestRecipeFollowsTheFilterContract(t *testing.T) {
	data, err := os.ReadFile("tether.yaml")
	if err != nil {
		t.Fatal(err)
	}
	fc := wire.FilterContract()
	var got wire.Filter
	var backendLimit uint32
	var overrideHeaders, removed []string
	found := map[string]bool{}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var doc recipeDoc
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		found[doc.Kind] = true
		switch doc.Kind {
		case "EnvoyExtensionPolicy":
			if len(doc.Spec.ExtProc) != 1 {
				t.Fatalf("%d extProc entries, want 1", len(doc.Spec.ExtProc))
			}
			ep := doc.Spec.ExtProc[0]
			if ep.ProcessingMode.Request.Body != "FullDuplexStreamed" || ep.ProcessingMode.Response.Body != "FullDuplexStreamed" {
				t.Errorf("body modes %q/%q, want FullDuplexStreamed both ways (the contract's full-duplex mode: %+v)",
					ep.ProcessingMode.Request.Body, ep.ProcessingMode.Response.Body, fc.FullDuplexMode)
			}
			got.MessageTimeout = duration(t, ep.MessageTimeout)
			got.FailureModeAllow = ep.FailOpen
			got.StatusOnError = ep.StatusOnError
			got.RequestAttributes = ep.ProcessingMode.Request.Attributes
			if w, a := ep.Metadata.Writable, ep.Metadata.Accessible; len(w) == 1 && len(a) == 1 && w[0] == a[0] {
				got.Namespace = w[0]
			}
			bs := ep.BackendSettings
			got.CircuitBreakerLimit = bs.CircuitBreaker.limit()
			if a := bs.HealthCheck.Active; a.Type == "GRPC" {
				got.HealthCheck = wire.HealthCheck{Service: a.GRPC.Service, Interval: duration(t, a.Interval), Timeout: duration(t, a.Timeout),
					UnhealthyThreshold: a.UnhealthyThreshold, HealthyThreshold: a.HealthyThreshold}
			}
			ka := bs.HTTP2.ConnectionKeepalive
			got.Keepalive = wire.Keepalive{Interval: duration(t, ka.Interval), Timeout: duration(t, ka.Timeout)}
		case "BackendTrafficPolicy":
			backendLimit = doc.Spec.CircuitBreaker.limit()
			for _, e := range doc.Spec.LoadBalancer.EndpointOverride.ExtractFrom {
				overrideHeaders = append(overrideHeaders, e.Header)
			}
		case "ClientTrafficPolicy":
			removed = doc.Spec.Headers.EarlyRequestHeaders.Remove
		}
	}
	for _, k := range []string{"EnvoyExtensionPolicy", "BackendTrafficPolicy", "ClientTrafficPolicy"} {
		if !found[k] {
			t.Fatalf("no %s in the recipe (kinds %v)", k, found)
		}
	}
	want := wire.Filter{MessageTimeout: fc.MessageTimeout, FailureModeAllow: fc.FailureModeAllow, StatusOnError: fc.StatusOnError,
		RequestAttributes: fc.RequestAttributes, Namespace: fc.Namespace, CircuitBreakerLimit: fc.CircuitBreakerLimit,
		HealthCheck: fc.HealthCheck, Keepalive: fc.Keepalive}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("ext_proc policy differs from the filter contract (-contract +recipe):\n%s", d)
	}
	if backendLimit != fc.CircuitBreakerLimit {
		t.Errorf("backend circuit breakers = %d, want %d", backendLimit, fc.CircuitBreakerLimit)
	}
	if d := cmp.Diff([]string{fc.DestinationHeader}, overrideHeaders); d != "" {
		t.Errorf("endpoint override headers (-contract +recipe):\n%s", d)
	}
	if d := cmp.Diff([]string{fc.DestinationHeader}, removed); d != "" {
		t.Errorf("early-removed headers (-contract +recipe):\n%s", d)
	}
}
