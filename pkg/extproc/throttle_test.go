package extproc_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/extproc"
	"github.com/tether-dev/tether/pkg/registry"
)

// A data plane that does not honour the destination answers every response from another host:
// each mismatch is counted, but the warning is logged at most once per interval, so a
// misconfigured Envoy cannot flood the log.
func TestServedHostMismatchWarningIsThrottled(t *testing.T) {
	var logs testutil.SyncBuffer
	svc := affinitytest.Service("web", registry.AffinityNone)
	e := newEnv(t, []registry.Service{svc}, affinitytest.Instances("web", 1),
		extproc.WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	const n = 50
	start := time.Now()
	for range n {
		st, _ := e.open(t, "web")
		roundTrip(t, st, reqHeaders("GET", "/", false))
		roundTrip(t, st, respHeaders("200", "127.0.0.1:9999", false)) // not the chosen 127.0.0.1:8001
		closeAndWait(t, st)
	}
	elapsed := time.Since(start)
	if s := e.srv.Stats(); s.ServedHostMismatches != n {
		t.Errorf("mismatches counted = %d, want %d", s.ServedHostMismatches, n)
	}
	warned := strings.Count(logs.String(), "served host differs")
	// One per 10 s interval the loop touched (it normally takes well under one).
	if most := 1 + int(elapsed/(10*time.Second)); warned < 1 || warned > most {
		t.Errorf("%d mismatches in %v logged %d warnings, want 1 to %d:\n%s", n, elapsed, warned, most, logs.String())
	}
}
