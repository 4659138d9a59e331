// Package envoygateway holds the Envoy Gateway recipe; deploy/recipetest decodes it into Envoy
// Gateway's own types (a module of its own), this test holds its names to tether's.
package envoygateway_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"

	"github.com/tether-dev/tether/pkg/xds"
)

// TestRecipeUsesTethersNames: the ext_proc metadata namespace, the request attributes and the
// endpoint-override header of tether.yaml are the ones tether writes and reads.
func TestRecipeUsesTethersNames(t *testing.T) {
	data, err := os.ReadFile("tether.yaml")
	if err != nil {
		t.Fatal(err)
	}
	type extProc struct {
		ProcessingMode struct {
			Request struct {
				Attributes []string `yaml:"attributes"`
			} `yaml:"request"`
		} `yaml:"processingMode"`
		Metadata struct {
			Writable   []string `yaml:"writableNamespaces"`
			Accessible []string `yaml:"accessibleNamespaces"`
		} `yaml:"metadata"`
	}
	var (
		found   = map[string]bool{}
		lb      = xds.DefaultLBNamespace
		dec     = yaml.NewDecoder(bytes.NewReader(data))
		headers []string
	)
	for {
		var doc struct {
			Kind string `yaml:"kind"`
			Spec struct {
				ExtProc      []extProc `yaml:"extProc"`
				LoadBalancer struct {
					EndpointOverride struct {
						ExtractFrom []struct {
							Header string `yaml:"header"`
						} `yaml:"extractFrom"`
					} `yaml:"endpointOverride"`
				} `yaml:"loadBalancer"`
			} `yaml:"spec"`
		}
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		found[doc.Kind] = true
		switch doc.Kind {
		case "EnvoyExtensionPolicy":
			for _, ep := range doc.Spec.ExtProc {
				if d := cmp.Diff(xds.ExtProcRequestAttributes(), ep.ProcessingMode.Request.Attributes); d != "" {
					t.Errorf("request attributes (-tether +recipe):\n%s", d)
				}
				if d := cmp.Diff([]string{lb}, ep.Metadata.Writable); d != "" {
					t.Errorf("writable namespaces (-tether +recipe):\n%s", d)
				}
				if d := cmp.Diff([]string{lb}, ep.Metadata.Accessible); d != "" {
					t.Errorf("accessible namespaces (-tether +recipe):\n%s", d)
				}
			}
		case "BackendTrafficPolicy":
			for _, e := range doc.Spec.LoadBalancer.EndpointOverride.ExtractFrom {
				headers = append(headers, e.Header)
			}
		}
	}
	if !found["EnvoyExtensionPolicy"] || !found["BackendTrafficPolicy"] {
		t.Fatalf("kinds %v, want an EnvoyExtensionPolicy and a BackendTrafficPolicy", found)
	}
	if d := cmp.Diff([]string{xds.DefaultDestinationHeader}, headers); d != "" {
		t.Errorf("endpoint override headers (-tether +recipe):\n%s", d)
	}
}
