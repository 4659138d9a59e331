package extproc

import (
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
)

// TestPreEncodedAnswers: what the codec sends for each shared answer (the plain CONTINUEs, a
// route answer) decodes to that answer, and send picks the pre-encoded form for each.
func TestPreEncodedAnswers(t *testing.T) {
	s := NewServer(nil)
	c := newCodec()
	answers := map[string]*preEncoded{"route": s.routeResponse("192.0.2.10", 8080)}
	for i, p := range s.cont.encoded {
		answers[[]string{"responseHeaders", "responseBody", "requestBody", "requestTrailers", "responseTrailers"}[i]] = p
		if got := s.cont.preEncoded(p.ProcessingResponse); got != p {
			t.Errorf("answer %d: preEncoded lookup = %v", i, got)
		}
	}
	if s.cont.preEncoded(&extprocv3.ProcessingResponse{}) != nil {
		t.Error("an answer of its own has a pre-encoded form")
	}
	if got := answers["route"].addr; got != "192.0.2.10:8080" {
		t.Errorf("route answer addr %q", got)
	}
	for name, p := range answers {
		wire, err := c.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.wire) == 0 || string(wire.Materialize()) != string(p.wire) {
			t.Errorf("%s: the codec did not send the pre-encoded bytes", name)
		}
		var got extprocv3.ProcessingResponse
		if err := c.Unmarshal(wire, &got); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(p.ProcessingResponse, &got, protocmp.Transform()); diff != "" {
			t.Errorf("%s decodes differently (-sent +decoded):\n%s", name, diff)
		}
	}
}
