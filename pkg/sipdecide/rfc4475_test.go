package sipdecide_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/sipdecide"
	"github.com/tether-dev/tether/pkg/wire"
)

// rfc4475 returns the torture messages under testdata/rfc4475 by file name. valid-* are the
// RFC's §3.1.1 valid messages transcribed from its text; invalid-* are crafted after its
// §3.1.2 descriptions (see testdata/rfc4475/README.md).
func rfc4475(t testing.TB) map[string][]byte {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "rfc4475", "*.sip"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no torture messages: %v", err)
	}
	out := map[string][]byte{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimSuffix(filepath.Base(f), ".sip")] = b
	}
	return out
}

// TestRFC4475TortureMessages: every valid torture message gets a decision, the same one
// again and from a second engine over the same instances (its key is deterministic); every
// invalid one gets 400 InvalidSIPMessage and no decision.
func TestRFC4475TortureMessages(t *testing.T) {
	instances := affinitytest.Instances("voice", 4)
	h1 := sipdecide.NewHandler(hashFixture(t, instances).Engine)
	h2 := sipdecide.NewHandler(hashFixture(t, instances).Engine)
	for name, msg := range rfc4475(t) {
		t.Run(name, func(t *testing.T) {
			var got []string
			for _, h := range []http.Handler{h1, h1, h2} {
				rec := post(t, h, "/v1/sip/voice/decide", string(msg), nil)
				got = append(got, rec.Header().Get(wire.SIPInstanceHeader))
				want := http.StatusOK
				if strings.HasPrefix(name, "invalid-") {
					want = http.StatusBadRequest
				}
				if rec.Code != want {
					t.Fatalf("status %d (%s), want %d", rec.Code, strings.TrimSpace(rec.Body.String()), want)
				}
				if want == http.StatusBadRequest && !strings.Contains(rec.Body.String(), "InvalidSIPMessage") {
					t.Errorf("400 without InvalidSIPMessage: %s", rec.Body.String())
				}
			}
			if strings.HasPrefix(name, "valid-") && (got[0] == "" || got[0] != got[1] || got[0] != got[2]) {
				t.Errorf("instances %q: want one instance, the same every time", got)
			}
		})
	}
}
