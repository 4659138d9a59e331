package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/affinity/affinitytest"
	"github.com/tether-dev/tether/pkg/api"
	"github.com/tether-dev/tether/pkg/api/apitest"
	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/registry"
	"github.com/tether-dev/tether/pkg/status"
	"github.com/tether-dev/tether/pkg/wire"
)

// TestStatusStream: /v1/status/stream sends the snapshot as a "status" event at once and again
// after a change; at most MaxStatusStreams are open at a time (the next gets 503).
func TestStatusStream(t *testing.T) {
	fx := affinitytest.New(t, []registry.Service{affinitytest.Service("web", registry.AffinityCookie)}, affinitytest.Instances("web", 2))
	a := status.New(fx.Registry, fx.Engine)
	srv := apitest.Serve(t, fx, apitest.WithAPIOptions(api.WithStatus(a.Snapshot, 20*time.Millisecond)))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	open := func() *http.Response {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/v1/status/stream", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = resp.Body.Close() })
		return resp
	}
	resp := open() //nolint:bodyclose // open closes it at cleanup
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	events := make(chan *tetherv1.Status, 100)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				st := &tetherv1.Status{}
				if protojson.Unmarshal([]byte(d), st) == nil {
					events <- st
				}
			}
		}
	}()
	sessions := func(st *tetherv1.Status) (n int32) {
		for _, in := range st.GetServices()[0].GetInstances() {
			n += in.GetSessions()
		}
		return n
	}
	if first := <-events; len(first.GetServices()) != 1 || sessions(first) != 0 {
		t.Fatalf("first event %v", first)
	}
	if r := testutil.Do(t, http.MethodPost, srv.URL+"/v1/services/web/sessions", "{}", wire.ClientHeader, "test", "Content-Type", "application/json"); r.Status != http.StatusCreated {
		t.Fatalf("create: %d", r.Status)
	}
	testutil.Eventually(t, "an event with the new session", func() bool {
		select {
		case st := <-events:
			return sessions(st) == 1
		default:
			return false
		}
	})

	for range api.MaxStatusStreams - 1 {
		if r := open(); r.StatusCode != http.StatusOK { //nolint:bodyclose // open closes it at cleanup
			t.Fatalf("stream below the limit: %d", r.StatusCode)
		}
	}
	if r := open(); r.StatusCode != http.StatusServiceUnavailable || r.Header.Get("Retry-After") == "" { //nolint:bodyclose // open closes it at cleanup
		t.Fatalf("stream over the limit: %d, Retry-After %q; want 503 with Retry-After", r.StatusCode, r.Header.Get("Retry-After"))
	}
}

// TestStatusStreamBeginsWithHistory: with WithStatusHistory the stream's first event is
// "history", the recorded samples as JSON, before the first "status".
func TestStatusStreamBeginsWithHistory(t *testing.T) {
	fx := affinitytest.New(t, []registry.Service{affinitytest.Service("web", registry.AffinityCookie)}, affinitytest.Instances("web", 2))
	o := status.NewOutcomes()
	h := status.NewHistory(o, time.Minute, 10*time.Second, nil)
	h.Record()
	o.Add("web", "NoCapacity")
	o.Add("web", "NoCapacity")
	h.Record()
	o.Add("web", "NoCapacity") // after the last step: in the sample taken at connect
	a := status.New(fx.Registry, fx.Engine, status.WithOutcomes(o))
	srv := apitest.Serve(t, fx, apitest.WithAPIOptions(api.WithStatus(a.Snapshot, time.Second), api.WithStatusHistory(h)))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/v1/status/stream", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	var lines []string
	for len(lines) < 5 && sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) < 5 || lines[0] != "event: history" || lines[3] != "event: status" {
		t.Fatalf("stream begins %q, want a history event then a status event", lines)
	}
	var ev struct {
		StepSeconds float64
		Samples     []status.Sample
	}
	if err := json.Unmarshal([]byte(strings.TrimPrefix(lines[1], "data: ")), &ev); err != nil {
		t.Fatal(err)
	}
	if ev.StepSeconds != 10 || len(ev.Samples) != 3 || len(ev.Samples[0].Decisions) != 0 || ev.Samples[1].Decisions["web"]["NoCapacity"] != 2 ||
		ev.Samples[2].Decisions["web"]["NoCapacity"] != 3 {
		t.Errorf("history %+v, want step 10 s, an empty sample, web NoCapacity 2, then one taken now with 3", ev)
	}
}
