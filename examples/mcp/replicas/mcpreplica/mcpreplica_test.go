package mcpreplica_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tether-dev/tether/examples/mcp/replicas/mcpreplica"
	"github.com/tether-dev/tether/internal/testutil"
)

// TestReplicaIdentifiesItself: a replica on a chosen address names itself in a header, in its
// session ids and in its tool results, records every request, and stops answering after Close.
func TestReplicaIdentifiesItself(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := mcpreplica.Start(ctx, "r1", mcpreplica.Options{Addr: addr, ProtocolVersions: []string{"2025-06-18"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Addr != addr {
		t.Fatalf("Addr = %s, want %s", s.Addr, addr)
	}

	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "ok" || resp.Header.Get(mcpreplica.InstanceHeader) != "r1" {
		t.Fatalf("healthz: %d %q %v", resp.StatusCode, body, resp.Header)
	}

	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "v1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := cs.InitializeResult().ProtocolVersion; got != "2025-06-18" {
		t.Errorf("negotiated %s, want the only version offered", got)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "whoami", Arguments: map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(res.StructuredContent)
	var who mcpreplica.WhoAmI
	if err := json.Unmarshal(b, &who); err != nil {
		t.Fatal(err)
	}
	if who.Instance != "r1" || who.Session != cs.ID() || !strings.HasPrefix(cs.ID(), "r1-") {
		t.Errorf("whoami = %+v, session %s; want r1 and an r1- session id", who, cs.ID())
	}
	sid := cs.ID()
	if err := cs.Close(); err != nil {
		t.Fatal(err)
	}

	// A record gets its status when the handler returns, just after the client has its answer.
	var log []mcpreplica.Record
	testutil.Poll(2*time.Second, func() bool {
		log = s.Log()
		n := len(log)
		return n > 0 && log[n-1].Status != 0
	})
	if len(log) == 0 || log[0].Method != http.MethodGet || log[0].URI != "/healthz" || log[0].Status != 200 {
		t.Fatalf("first record %+v, want GET /healthz 200", log)
	}
	var deletes int
	for _, r := range log[1:] {
		if r.Method == http.MethodDelete && r.Session == sid && r.Status == http.StatusNoContent {
			deletes++
		}
	}
	if deletes != 1 || s.RequestsFor(http.MethodDelete, "/mcp") != 1 || int(s.Requests()) != len(log) {
		t.Errorf("log %+v: want one DELETE of %s answered 204, counters matching the log", log, sid)
	}

	s.Close()
	if resp, err := http.Get("http://" + addr + "/healthz"); err == nil {
		_ = resp.Body.Close()
		t.Error("the replica still answers after Close")
	}
}
