package main

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redis/rueidis"

	"github.com/tether-dev/tether/internal/redistest"
	"github.com/tether-dev/tether/pkg/config"
)

// TestServeRefusesANewerProtocol: tether serve on a Redis whose data set was switched to a
// protocol above this build's exits at start, saying so; on its own protocol it starts far
// enough to speak it (openProtocol), and with a replica of e11d6a0 connected (a connection
// named "tether") its leases speak protocol 1.
func TestServeRefusesANewerProtocol(t *testing.T) {
	srv := redistest.Start(t)
	path := filepath.Join(t.TempDir(), "tether.yaml")
	writeFile(t, path, fmt.Sprintf(`apiVersion: tether/v1
listeners: {extProc: 127.0.0.1:0, xds: 127.0.0.1:0, api: 127.0.0.1:0, sip: ""}
store:
  backend: redis
  redis: {addresses: [%q]}
services:
- {name: web, affinity: cookie, match: {pathPrefix: /web}}
`, srv.Addr))
	if _, err := srv.Do("SET", "tether:protocol", "3"); err != nil {
		t.Fatal(err)
	}
	var out, errOut strings.Builder
	code := run(context.Background(), []string{"serve", "-c", path}, &out, &errOut)
	if code == 0 || !strings.Contains(errOut.String(), "newer tether protocol: tether:protocol is 3, this build speaks up to 2") {
		t.Fatalf("serve on a protocol-3 data set: exit %d\n%s%s", code, out.String(), errOut.String())
	}

	if _, err := srv.Do("SET", "tether:protocol", "2"); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	old, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, ClientName: "tether", DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	st, leases, err := openRedisStore(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := openProtocol(context.Background(), st, leases, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if p := leases.SpeakingProtocol(); p != 1 {
		t.Errorf("with an e11d6a0 replica connected the leases speak %d, want 1", p)
	}
	old.Close()
}
