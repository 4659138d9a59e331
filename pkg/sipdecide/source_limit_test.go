package sipdecide_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"testing"

	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/calls"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/sipdecide"
	"github.com/tether-dev/tether/pkg/wire"
)

// TestUnansweredInvitesCannotFillCallCaps is #25 finding 2 for SIP: on the landed build one
// source deciding INVITEs it never answers filled both instances' call caps (10 each) for the
// setup TTL (5 minutes). With a per-source limit on calls in setup (calls.perSourceSetup; auto:
// cap/4 = 2) one source holds at most 2, requests without a source share one bucket, another
// source still gets its calls, a trusted source is not limited, and an answered call frees
// its source's place.
func TestUnansweredInvitesCannotFillCallCaps(t *testing.T) {
	const service = "voice"
	svc := affinitytest.Service(service, registry.AffinityHash)
	insts := affinitytest.Instances(service, 2)
	for i := range insts {
		insts[i].SIPPort = 5060 + i
	}
	f := affinitytest.New(t, []registry.Service{svc}, insts)
	tr := calls.New()
	tr.SetLimits(service, calls.Limits{Cap: 10, SourceSetup: 10 / 4})
	srv := httptest.NewServer(sipdecide.NewHandler(f.Engine, sipdecide.WithCalls(tr),
		sipdecide.WithTrustedSources([]netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")})))
	t.Cleanup(srv.Close)

	n := 0
	invite := func(source string) (int, string) {
		n++
		callID := fmt.Sprintf("call-%d@attacker", n)
		q := url.Values{"method": {"INVITE"}, "ruri": {"sip:bob@example.com"}, "callid": {callID},
			"from": {"<sip:alice@example.com>;tag=" + callID}}
		req, _ := http.NewRequest("POST", srv.URL+"/v1/sip/"+service+"/decide?"+q.Encode(), nil)
		if source != "" {
			req.Header.Set(wire.SIPSourceHeader, source)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		return resp.StatusCode, callID
	}
	decided := func(source string, tries int) (ok int, last string) {
		for range tries {
			code, id := invite(source)
			if code == http.StatusOK {
				ok++
				last = id
			}
		}
		return ok, last
	}
	total := func() int {
		s := 0
		for _, l := range tr.Loads(service) {
			s += l.Total()
		}
		return s
	}

	if ok, _ := decided("203.0.113.9:5060", 40); ok != 2 {
		t.Errorf("one source got %d of 40 unanswered INVITEs decided, want 2 (its setup limit)", ok)
	}
	if ok, _ := decided("[2001:db8:5:6::1]:5060", 5); ok != 2 {
		t.Errorf("an IPv6 source got %d, want 2", ok)
	}
	if ok, _ := decided("", 10); ok != 2 {
		t.Errorf("requests without a source got %d, want 2 (one shared bucket)", ok)
	}
	if ok, _ := decided("garbage", 10); ok != 0 {
		t.Errorf("a malformed source got %d, want 0 (the same shared bucket as no source)", ok)
	}
	if got := total(); got != 6 {
		t.Errorf("calls counted %d, want 6 of the 20 the caps allow", got)
	}
	ok, last := decided("198.51.100.7:5060", 2)
	if ok != 2 {
		t.Errorf("another source got %d of 2, want both", ok)
	}
	if _, err := tr.Answered(service, last); err != nil {
		t.Fatal(err)
	}
	if ok, _ := decided("198.51.100.7:5060", 1); ok != 1 {
		t.Error("an answered call did not free its source's place in setup")
	}
	if ok, _ := decided("192.0.2.10:5060", 5); ok != 5 {
		t.Errorf("a trusted source got %d of 5, want all 5 (not limited per source; under the caps)", ok)
	}
	if code, _ := invite("203.0.113.9:5060"); code != http.StatusServiceUnavailable {
		t.Errorf("over the limit: %d, want 503", code)
	}
}
