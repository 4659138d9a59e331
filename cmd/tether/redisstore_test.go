package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-dev/tether/internal/redistest"
	"github.com/tether-dev/tether/internal/testutil"
	tetherv1 "github.com/tether-dev/tether/pkg/api/gen/tether/v1"
	"github.com/tether-dev/tether/pkg/config"
	"github.com/tether-dev/tether/pkg/servertls/servertlstest"
	"github.com/tether-dev/tether/pkg/session"
	"github.com/tether-dev/tether/pkg/wire"
)

// TestServeReplicasShareRedis: two serve processes' worth of tether (in one test process) on
// one redis-server share sessions: a session placed through replica 1's SessionAPI is read and
// deleted through replica 2's.
func TestServeReplicasShareRedis(t *testing.T) {
	srv := redistest.Start(t)
	port := upstreamPort(t)
	var apis []string
	for i := range 2 {
		dir := t.TempDir()
		path := filepath.Join(dir, "tether.yaml")
		cfg := strings.Replace(testConfig(port), "log: {level: debug}\n",
			fmt.Sprintf("log: {level: debug}\nstore:\n  backend: redis\n  redis: {addresses: [%q], keyPrefix: 'serve-test:'}\n", srv.Addr), 1)
		writeFile(t, path, cfg)
		ctx, cancel := context.WithCancel(context.Background())
		ready := make(chan serveInfo, 1)
		var logs testutil.SyncBuffer
		done := make(chan error, 1)
		go func() {
			done <- serve(ctx, serveOptions{configPath: path, logOut: &logs, reload: make(chan os.Signal, 1),
				ready: func(i serveInfo) { ready <- i }})
		}()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Logf("serve: %v", err)
			}
		})
		select {
		case info := <-ready:
			apis = append(apis, "http://"+info.apiAddr)
		case err := <-done:
			t.Fatalf("replica %d: serve returned early: %v\n%s", i, err, logs.String())
		case <-time.After(15 * time.Second):
			t.Fatalf("replica %d not ready", i)
		}
	}
	resp, err := testutil.PostJSON(apis[0]+"/v1/services/web/sessions", `{"ttl":"600s"}`)
	if err != nil {
		t.Fatal(err)
	}
	var created struct {
		ID       string `json:"id"`
		Instance string `json:"instance"`
	}
	err = json.NewDecoder(resp.Body).Decode(&created)
	_ = resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusCreated || created.ID == "" {
		t.Fatalf("create through replica 1: %d %+v %v", resp.StatusCode, created, err)
	}
	if code, body := get(t, apis[1]+"/v1/status"); code != http.StatusOK || !strings.Contains(body, `"store"`) {
		t.Errorf("/v1/status of a replica on Redis: %d, no store part: %s", code, body)
	}
	code, body := get(t, apis[1]+"/v1/services/web/sessions/"+created.ID)
	if code != http.StatusOK || !strings.Contains(body, created.ID) {
		t.Fatalf("get through replica 2: %d %s", code, body)
	}
	req, _ := http.NewRequest(http.MethodDelete, apis[1]+"/v1/services/web/sessions/"+created.ID, nil)
	req.Header.Set(wire.ClientHeader, "test")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("delete through replica 2: %d", resp.StatusCode)
	}
	if code, body := get(t, apis[0]+"/v1/services/web/sessions/"+created.ID); code != http.StatusOK || !strings.Contains(body, "SESSION_STATUS_TERMINATED") {
		t.Errorf("get through replica 1 after the delete: %d %s", code, body)
	}
}

// TestReplicasExampleBootstrapIsGenerated keeps examples/replicas/envoy.yaml equal to what
// `tether bootstrap -c examples/replicas/tether-1.yaml` prints, for every replica's config
// (they describe the same fleet, so they print the same bootstrap).
func TestReplicasExampleBootstrapIsGenerated(t *testing.T) {
	t.Chdir("../..")
	want, err := os.ReadFile("examples/replicas/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		cfgPath := fmt.Sprintf("examples/replicas/tether-%d.yaml", i)
		code, stdout, stderr := runCmd(t, "bootstrap", "-c", cfgPath)
		if code != 0 {
			t.Fatalf("tether bootstrap -c %s exited %d: %s", cfgPath, code, stderr)
		}
		// The generated-by comment names the file it was made from.
		got := strings.Replace(stdout, cfgPath, "examples/replicas/tether-1.yaml", 1)
		if got != string(want) {
			t.Errorf("examples/replicas/envoy.yaml differs from the bootstrap of %s; regenerate with\n  go run ./cmd/tether bootstrap -c examples/replicas/tether-1.yaml > examples/replicas/envoy.yaml", cfgPath)
		}
	}
}

// TestRedisStoreOverMutualTLS: store.redis.tls reaches a redis-server that requires client
// certificates; without an accepted certificate, or without trusting the server, the store
// does not open (serve would not start).
func TestRedisStoreOverMutualTLS(t *testing.T) {
	ca := servertlstest.NewCA(t, "redis-ca")
	srvPair := ca.Server(t, "redis")
	_, tlsAddr := redistest.StartTLS(t, ca.File, srvPair.CertFile, srvPair.KeyFile)
	client := ca.Client(t, "tether")
	other := servertlstest.NewCA(t, "other-ca")
	stranger := other.Client(t, "stranger")
	for _, tc := range []struct {
		name string
		tls  config.RedisTLS
		ok   bool
	}{
		{"client certificate", config.RedisTLS{Enabled: true, CAFile: ca.File, CertFile: client.CertFile, KeyFile: client.KeyFile}, true},
		{"no client certificate", config.RedisTLS{Enabled: true, CAFile: ca.File}, false},
		{"certificate of another CA", config.RedisTLS{Enabled: true, CAFile: ca.File, CertFile: stranger.CertFile, KeyFile: stranger.KeyFile}, false},
		{"server not trusted", config.RedisTLS{Enabled: true, CAFile: other.File, CertFile: client.CertFile, KeyFile: client.KeyFile}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &config.Config{}
			cfg.Store.Redis.Addresses = []string{tlsAddr}
			cfg.Store.Redis.KeyPrefix = "tls-test:"
			cfg.Store.Redis.TLS = tc.tls
			st, _, err := openRedisStore(cfg, slog.New(slog.DiscardHandler))
			if !tc.ok {
				if err == nil {
					st.Close()
					t.Fatal("the store opened")
				}
				t.Logf("refused: %v", err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			ctx := context.Background()
			s := session.Session{ID: "0123456789abcdef0123456789abcdef", Service: "web", Instance: "i1", Kind: session.KindCookie, TTL: time.Minute}
			if err := st.Create(ctx, s); err != nil {
				t.Fatal(err)
			}
			if got, err := st.Get(ctx, "web", s.ID); err != nil || got.Instance != "i1" {
				t.Fatalf("Get over TLS = %+v, %v", got, err)
			}
		})
	}
}

// TestEvictingRedisIsReportedLoudly: a Redis whose maxmemory-policy evicts keys is named at
// start at error level; noeviction is not.
func TestEvictingRedisIsReportedLoudly(t *testing.T) {
	for _, tc := range []struct {
		policy string
		loud   bool
	}{{"allkeys-lru", true}, {"volatile-ttl", true}, {"noeviction", false}} {
		t.Run(tc.policy, func(t *testing.T) {
			srv := redistest.Start(t, redistest.WithArgs("--maxmemory-policy", tc.policy))
			cfg, err := config.Parse([]byte(fmt.Sprintf("apiVersion: tether/v1\nstore:\n  backend: redis\n  redis: {addresses: [%q]}\nservices: []\n", srv.Addr)), "tether.yaml")
			if err != nil {
				t.Fatal(err)
			}
			var logs testutil.SyncBuffer
			st, _, err := openRedisStore(cfg, slog.New(slog.NewTextHandler(&logs, nil)))
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			loud := strings.Contains(logs.String(), "level=ERROR") && strings.Contains(logs.String(), "maxmemory-policy="+tc.policy)
			if loud != tc.loud {
				t.Errorf("maxmemory-policy %s: error logged %v, want %v; log:\n%s", tc.policy, loud, tc.loud, logs.String())
			}
		})
	}
}

// TestQuotaMetrics: a Redis that lost its data while a replica held a lease shows as one more
// epoch change, in the metrics, in /v1/status's store part and in `tether status`; an
// unreachable Redis as degraded.
func TestQuotaMetrics(t *testing.T) {
	srv := redistest.Start(t)
	cfg, err := config.Parse([]byte(fmt.Sprintf("apiVersion: tether/v1\nstore:\n  backend: redis\n  redis: {addresses: [%q]}\nservices: []\n", srv.Addr)), "tether.yaml")
	if err != nil {
		t.Fatal(err)
	}
	st, leases, err := openRedisStore(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	reg := prometheus.NewRegistry()
	registerQuotaMetrics(reg, leases)
	value := func(name string) float64 {
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() == name {
				m := f.GetMetric()[0]
				return m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
		t.Fatalf("no metric %s", name)
		return 0
	}
	ctx := context.Background()
	storeStatus := redisStatus(st, leases)
	printed := func() string {
		var b strings.Builder
		if err := printStatus(&b, &tetherv1.Status{Store: storeStatus()}); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	if got := storeStatus(); !got.GetReachable() || got.GetEpochChanges() != 0 || got.GetLastEpochChangeTime() != nil {
		t.Errorf("store status at start: %v", got)
	}
	if out := printed(); !strings.Contains(out, "redis: reachable, not degraded, no data loss seen") {
		t.Errorf("tether status at start:\n%s", out)
	}
	if err := leases.Seed(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	p := leases.Pool("web", "i1", func() int { return 10 })
	if !p.TryAcquire(context.Background()) {
		t.Fatal("no slot")
	}
	if _, err := srv.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	for range 20 { // borrow past the lease: the call meets the new epoch
		p.TryAcquire(context.Background())
	}
	if v := value("tether_quota_epoch_changes_total"); v != 1 {
		t.Errorf("tether_quota_epoch_changes_total = %v after FLUSHALL, want 1", v)
	}
	got := storeStatus()
	if got.GetEpochChanges() != 1 || got.GetLastEpochChangeTime() == nil ||
		got.GetLearningUntil().AsTime().Sub(got.GetLastEpochChangeTime().AsTime()) != leases.Hold() {
		t.Errorf("store status after FLUSHALL: %v, want 1 epoch change and a learning window of %v", got, leases.Hold())
	}
	if out := printed(); !strings.Contains(out, "DATA LOST 1 time(s)") {
		t.Errorf("tether status after FLUSHALL:\n%s", out)
	}
	if v := value("tether_quota_degraded"); v != 0 {
		t.Errorf("tether_quota_degraded = %v with Redis up", v)
	}
	srv.Kill()
	testutil.Eventually(t, "tether_quota_degraded 1 with Redis down", func() bool {
		p.TryAcquire(context.Background()) // a borrow (the lease is used up) finds Redis gone
		return value("tether_quota_degraded") == 1
	})
	if got := storeStatus(); !got.GetDegraded() {
		t.Errorf("store status with Redis down: %v", got)
	}
}

// TestAckDurabilityAOFRefusesToStart: store.redis.ackDurability aof on a Redis without
// appendfsync always stops serve at start with the reason; with it, the store opens.
func TestAckDurabilityAOFRefusesToStart(t *testing.T) {
	for _, tc := range []struct {
		fsync string
		ok    bool
	}{{"everysec", false}, {"always", true}} {
		t.Run(tc.fsync, func(t *testing.T) {
			srv := redistest.Start(t, redistest.WithAOF(tc.fsync))
			cfg, err := config.Parse([]byte(fmt.Sprintf("apiVersion: tether/v1\nstore:\n  backend: redis\n  redis: {addresses: [%q], ackDurability: aof}\nservices: []\n", srv.Addr)), "tether.yaml")
			if err != nil {
				t.Fatal(err)
			}
			st, _, err := openRedisStore(cfg, slog.New(slog.DiscardHandler))
			if tc.ok {
				if err != nil {
					t.Fatalf("appendfsync always: %v", err)
				}
				st.Close()
				return
			}
			if err == nil {
				st.Close()
				t.Fatal("appendfsync everysec: the store opened; want a refusal")
			}
			if want := `store.redis: redis store: ackDurability aof: the server runs appendonly "yes", appendfsync "everysec": want appendonly yes and appendfsync always`; !strings.HasPrefix(err.Error(), want) {
				t.Errorf("refusal:\n%v\nwant it to start with:\n%s", err, want)
			}
		})
	}
}
