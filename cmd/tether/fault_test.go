package main

// The fault suite of issue 14: a real tether process killed with SIGKILL under load with
// snapshots on, damaged snapshots, a disk that fills up under the snapshot, and 20,000
// streams that never speak. The tether process is this test binary re-executed
// (TestFaultChild), which runs serve exactly as `tether serve` does.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/session/memstore"
	"github.com/tether-dev/tether/pkg/wire"
)

const faultChildEnv = "TETHER_FAULT_CHILD_CONFIG"

// faultChildNofileEnv, if set, is the child's RLIMIT_NOFILE (soft and hard).
const faultChildNofileEnv = "TETHER_FAULT_CHILD_NOFILE"

// TestFaultChild is the tether process of the fault suite: with faultChildEnv set it serves
// (under faultChildNofileEnv's descriptor limit, when set)
// that config until SIGTERM, printing "READY api=ADDR extproc=ADDR" once every listener is
// bound; a startup error is printed as `tether serve` prints it, with exit code 1.
func TestFaultChild(t *testing.T) {
	path := os.Getenv(faultChildEnv)
	if path == "" {
		t.Skip("fault-suite child process only")
	}
	if n, err := strconv.ParseUint(os.Getenv(faultChildNofileEnv), 10, 64); err == nil {
		// Soft and hard: Go cannot raise it back, as a container's limit would hold.
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: n, Max: n}); err != nil {
			fmt.Fprintf(os.Stderr, "setrlimit: %v\n", err)
			os.Exit(1)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	err := serve(ctx, serveOptions{configPath: path, logOut: os.Stderr, reload: make(chan os.Signal),
		ready: func(i serveInfo) { fmt.Printf("READY api=%s extproc=%s\n", i.apiAddr, i.extProcAddr) }})
	if err != nil {
		fmt.Fprintf(os.Stderr, "tether serve: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// child is a running tether process.
type child struct {
	cmd          *exec.Cmd
	api, extProc string
	stderr       *testutil.SyncBuffer
	exited       chan struct{}
	exitCode     int
}

// startChild starts tether on config (env added to its environment); it returns once the child is READY, or with the
// child's exit if it fails to start (ready false).
func startChild(t *testing.T, config string, env ...string) (c *child, ready bool) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestFaultChild$")
	cmd.Env = append(append(os.Environ(), faultChildEnv+"="+config), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c = &child{cmd: cmd, stderr: &testutil.SyncBuffer{}, exited: make(chan struct{})}
	cmd.Stderr = c.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "READY ") {
				lines <- sc.Text()
			}
		}
		close(lines)
		_ = cmd.Wait()
		c.exitCode = cmd.ProcessState.ExitCode()
		close(c.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.exited
	})
	select {
	case line, ok := <-lines:
		if !ok {
			<-c.exited
			return c, false
		}
		for _, f := range strings.Fields(line)[1:] {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "api":
				c.api = v
			case "extproc":
				c.extProc = v
			}
		}
		return c, true
	case <-time.After(60 * time.Second):
		t.Fatalf("tether did not start:\n%s", c.stderr.String())
	}
	return nil, false
}

// kill9 kills the child with SIGKILL and waits for it.
func (c *child) kill9(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-c.exited
}

// metric reads one sample of the child's /metrics (the first line starting with name).
func (c *child) metric(t *testing.T, name string) float64 {
	t.Helper()
	code, body := get(t, "http://"+c.api+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, name+" ") {
			v, err := strconv.ParseFloat(strings.Fields(line)[1], 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("/metrics has no %s", name)
	return 0
}

// sessionIDs lists every session id of service web through the API, following page tokens.
func sessionIDs(t *testing.T, api string) map[string]bool {
	t.Helper()
	ids := map[string]bool{}
	token := ""
	for {
		code, body := get(t, "http://"+api+"/v1/services/web/sessions?limit=1000&pageToken="+token)
		if code != http.StatusOK {
			t.Fatalf("list sessions: %d %s", code, body)
		}
		var page struct {
			Sessions []struct {
				ID string `json:"id"`
			} `json:"sessions"`
			NextPageToken string `json:"nextPageToken"`
		}
		if err := json.Unmarshal([]byte(body), &page); err != nil {
			t.Fatal(err)
		}
		for _, s := range page.Sessions {
			ids[s.ID] = true
		}
		if page.NextPageToken == "" {
			return ids
		}
		token = page.NextPageToken
	}
}

func faultConfig(dir, extra string) string {
	var b strings.Builder
	b.WriteString("apiVersion: tether/v1\nregistry: {allowedNetworks: [127.0.0.1/32]}\nlisteners: {api: 127.0.0.1:0, extProc: 127.0.0.1:0, xds: '', sip: ''}\n")
	b.WriteString("store: {snapshotPath: " + filepath.Join(dir, "sessions.snap") + ", snapshotInterval: 1s}\n")
	b.WriteString(extra)
	b.WriteString("services:\n- name: web\n  affinity: cookie\n  sessionsPerInstance: 200\n  instances:\n")
	for i := range 50 { // 10,000 session slots: the load never fills them
		fmt.Fprintf(&b, "  - {id: i%d, address: 127.0.0.1, ports: {http: %d}}\n", i, 18000+i)
	}
	return b.String()
}

// TestFaultKill9UnderLoadLosesAtMostOneInterval creates sessions through the API from two
// clients while snapshots run every second, kills tether with SIGKILL, restarts it on the
// same snapshot and counts what survived: every session acknowledged more than one interval
// (plus the snapshot's own write time) before the kill is back; the loss is reported. Then
// the snapshot is damaged (truncated, one bit flipped): tether refuses to start with a clear
// error, exit code 1, and leaves the file as it was.
func TestFaultKill9UnderLoadLosesAtMostOneInterval(t *testing.T) {
	if testing.Short() {
		t.Skip("starts tether processes")
	}
	dir := t.TempDir()
	config := filepath.Join(dir, "tether.yaml")
	writeFile(t, config, faultConfig(dir, ""))
	c, ok := startChild(t, config)
	if !ok {
		t.Fatalf("tether exited %d:\n%s", c.exitCode, c.stderr.String())
	}

	type created struct {
		id string
		at time.Time
	}
	var mu sync.Mutex
	var acked []created
	stop := make(chan struct{})
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 5 * time.Second}
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				req, _ := http.NewRequest(http.MethodPost, "http://"+c.api+"/v1/services/web/sessions", strings.NewReader("{}"))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set(wire.ClientHeader, "test")
				resp, err := client.Do(req)
				if err != nil {
					return // the kill
				}
				var s struct {
					ID string `json:"id"`
				}
				err = json.NewDecoder(resp.Body).Decode(&s)
				_ = resp.Body.Close()
				if resp.StatusCode == http.StatusCreated && err == nil {
					mu.Lock()
					acked = append(acked, created{s.ID, time.Now()})
					mu.Unlock()
				}
			}
		})
	}
	// Load for a few snapshot intervals, then SIGKILL in the middle of it (sooner on a fast
	// machine, before the 10,000 slots fill and the load stops).
	waitFor(t, "sessions under load", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(acked) > 0 && (time.Since(acked[0].at) > 3500*time.Millisecond || len(acked) > 7000 && time.Since(acked[0].at) > 2*time.Second)
	})
	killedAt := time.Now()
	c.kill9(t)
	close(stop)
	wg.Wait()

	c2, ok := startChild(t, config)
	if !ok {
		t.Fatalf("restart on the snapshot: exit %d:\n%s", c2.exitCode, c2.stderr.String())
	}
	restored := sessionIDs(t, c2.api)
	const interval = time.Second
	bound := killedAt.Add(-interval - 500*time.Millisecond) // one interval plus the write itself
	lost, lostEarly := 0, 0
	var newestKept, oldestLost time.Time
	for _, s := range acked {
		if restored[s.id] {
			if s.at.After(newestKept) {
				newestKept = s.at
			}
			continue
		}
		lost++
		if oldestLost.IsZero() || s.at.Before(oldestLost) {
			oldestLost = s.at
		}
		if s.at.Before(bound) {
			lostEarly++
		}
	}
	window := "none lost"
	if lost > 0 {
		window = fmt.Sprintf("the lost ones were acknowledged in the last %v before the kill", killedAt.Sub(oldestLost).Round(time.Millisecond))
	}
	t.Logf("SIGKILL under load: %d sessions acknowledged, %d restored, %d lost (%.1f%%); %s (snapshot interval %v)",
		len(acked), len(restored), lost, 100*float64(lost)/float64(len(acked)), window, interval)
	if lostEarly > 0 {
		t.Errorf("%d sessions acknowledged more than %v before the kill were lost", lostEarly, killedAt.Sub(bound))
	}
	if len(restored) == 0 {
		t.Errorf("nothing restored of %d sessions", len(acked))
	}
	if err := c2.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-c2.exited
	if c2.exitCode != 0 {
		t.Fatalf("SIGTERM: exit %d:\n%s", c2.exitCode, c2.stderr.String())
	}

	snap := filepath.Join(dir, "sessions.snap")
	good, err := os.ReadFile(snap)
	if err != nil {
		t.Fatal(err)
	}
	flipped := bytes.Clone(good)
	flipped[len(flipped)/3] ^= 0x04
	for name, bad := range map[string][]byte{"truncated": good[:len(good)/2], "one bit flipped": flipped} {
		t.Run(name, func(t *testing.T) {
			if err := os.WriteFile(snap, bad, 0o600); err != nil {
				t.Fatal(err)
			}
			c, ok := startChild(t, config)
			if ok {
				t.Fatal("tether started on a damaged snapshot")
			}
			if c.exitCode != 1 || !strings.Contains(c.stderr.String(), "checksum mismatch") ||
				!strings.Contains(c.stderr.String(), snap) {
				t.Errorf("exit %d; want 1 and the checksum error naming the file:\n%s", c.exitCode, c.stderr.String())
			}
			if kept, err := os.ReadFile(snap); err != nil || !bytes.Equal(kept, bad) {
				t.Errorf("the damaged snapshot was changed (%v)", err)
			}
		})
	}
}

// TestFaultFullDiskKeepsTheOldSnapshot puts the snapshot on a 64 KiB tmpfs (mounted here when
// the test runs as root and may mount; otherwise path.tmp is made a link to /dev/full, which
// fails every write with ENOSPC). Once sessions outgrow the disk, the periodic snapshot fails:
// the failure is logged with its cause, the previous snapshot stays intact and restorable,
// no temporary file is left, and tether keeps serving.
func TestFaultFullDiskKeepsTheOldSnapshot(t *testing.T) {
	if testing.Short() {
		t.Skip("mounts a tmpfs or uses /dev/full")
	}
	dir := t.TempDir()
	snapDir := filepath.Join(dir, "disk")
	if err := os.Mkdir(snapDir, 0o700); err != nil {
		t.Fatal(err)
	}
	mounted := exec.Command("mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", snapDir).Run() == nil
	if mounted {
		t.Cleanup(func() { _ = exec.Command("umount", snapDir).Run() })
	} else if _, err := os.Stat("/dev/full"); err != nil {
		t.Fatal("neither a tmpfs mount nor /dev/full is available for the full-disk test")
	}
	t.Logf("full disk by %s", map[bool]string{true: "a 64 KiB tmpfs", false: "a /dev/full link"}[mounted])
	path := filepath.Join(dir, "tether.yaml")
	writeFile(t, path, faultConfig(snapDir, ""))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs testutil.SyncBuffer
	ready := make(chan serveInfo, 1)
	done := make(chan error, 1)
	go func() {
		done <- serve(ctx, serveOptions{configPath: path, logOut: &logs, reload: make(chan os.Signal), ready: func(i serveInfo) { ready <- i }})
	}()
	var info serveInfo
	select {
	case info = <-ready:
	case err := <-done:
		t.Fatalf("serve: %v", err)
	}
	create := func(n int, attrs string) {
		for range n {
			resp, err := testutil.PostJSON("http://"+info.apiAddr+"/v1/services/web/sessions", attrs)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				t.Fatalf("create: %d", resp.StatusCode)
			}
		}
	}
	snap := filepath.Join(snapDir, "sessions.snap")
	create(5, "{}")
	waitFor(t, "a first snapshot with the 5 sessions", func() bool {
		st := memstore.New()
		n, err := st.RestoreSnapshot(snap)
		return err == nil && n == 5
	})
	old, err := os.ReadFile(snap)
	if err != nil {
		t.Fatal(err)
	}
	if !mounted {
		if err := os.Symlink("/dev/full", snap+".tmp"); err != nil {
			t.Fatal(err)
		}
	}
	// 20 sessions of 8 KiB of attributes each: 160 KiB, more than the disk holds.
	create(20, `{"attributes":{"pad":"`+strings.Repeat("x", 8<<10)+`"}}`)
	waitFor(t, "the failed snapshot logged", func() bool {
		return strings.Contains(logs.String(), "session snapshot failed") && strings.Contains(logs.String(), "no space left on device")
	})
	now, err := os.ReadFile(snap)
	if err != nil || !bytes.Equal(old, now) {
		t.Fatalf("the previous snapshot changed under a full disk (%v)", err)
	}
	st := memstore.New()
	if n, err := st.RestoreSnapshot(snap); err != nil || n != 5 {
		t.Errorf("the previous snapshot restores %d, %v; want 5", n, err)
	}
	if mounted {
		if _, err := os.Lstat(snap + ".tmp"); err == nil {
			t.Error("a temporary file was left on the full disk")
		}
	}
	if code, _ := get(t, "http://"+info.apiAddr+"/healthz"); code != http.StatusOK {
		t.Errorf("tether stopped serving after the failed snapshot: /healthz %d", code)
	}
	cancel()
	if err := <-done; err != nil { // the final snapshot fails too; serve still stops
		t.Logf("serve after the failed final snapshot: %v", err)
	}
}

// TestFaultSilentStreamsAreClosed opens 20,000 ext_proc streams (5,000 under the race
// detector) against a real tether process and never sends a message: tether holds them
// (goroutines and heap measured), closes every one after extProc.firstMessageTimeout, and its
// goroutines return to where they were and its heap gives back at least 60% of what the
// streams took (the Go runtime keeps the descriptors of exited goroutines, about 0.6 KB each
// of the two goroutines per stream, for reuse: that is most of the rest).
func TestFaultSilentStreamsAreClosed(t *testing.T) {
	if testing.Short() {
		t.Skip("opens thousands of streams")
	}
	n := 20_000
	if raceEnabled {
		n = 5_000
	}
	dir := t.TempDir()
	config := filepath.Join(dir, "tether.yaml")
	writeFile(t, config, faultConfig(dir, "extProc: {firstMessageTimeout: 6s}\n"))
	// GOGC=25 makes the idle child collect garbage after a little allocation (the /metrics
	// scrapes below), so the heap it gives back is measurable without waiting for the
	// 2-minute forced GC.
	c, ok := startChild(t, config, "GOGC=25")
	if !ok {
		t.Fatalf("tether exited %d:\n%s", c.exitCode, c.stderr.String())
	}
	baseG, baseHeap := c.metric(t, "go_goroutines"), c.metric(t, "go_memstats_heap_inuse_bytes")
	var conns []*grpc.ClientConn
	for range 8 {
		conn, err := grpc.NewClient(c.extProc, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = conn.Close() }()
		conns = append(conns, conn)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Each stream reports how long it lived from its own open: the bound below is per stream,
	// so it holds however long opening all n takes on a loaded machine (14–27 s at load 27+,
	// longer than the timeout: the first streams end before the last open).
	type end struct {
		err  error
		held time.Duration
	}
	ended := make(chan end, n)
	opened := time.Now()
	for i := range n {
		start := time.Now()
		st, err := extprocv3.NewExternalProcessorClient(conns[i%len(conns)]).Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			_, err := st.Recv()
			ended <- end{err, time.Since(start)}
		}()
	}
	waitFor(t, "every stream accepted by tether", func() bool { return c.metric(t, "tether_extproc_streams_total") >= float64(n) })
	peakOpen, peakG, peakHeap := c.metric(t, "tether_extproc_open_streams"), c.metric(t, "go_goroutines"), c.metric(t, "go_memstats_heap_inuse_bytes")
	var shortest time.Duration
	for i := range n {
		e := <-ended
		if status.Code(e.err) != codes.DeadlineExceeded {
			t.Fatalf("a silent stream ended with %v, want DEADLINE_EXCEEDED", e.err)
		}
		if i == 0 || e.held < shortest {
			shortest = e.held
		}
	}
	// tether's timer starts when it accepts the stream, after the client opened it: no stream
	// may end sooner than the timeout (a refused or reset stream would).
	if shortest < 6*time.Second-50*time.Millisecond {
		t.Errorf("a silent stream was closed %v after it opened, before the 6s first-message timeout", shortest)
	}
	closedAfter := time.Since(opened)
	for _, conn := range conns { // the client (Envoy) goes away too: its connections' state is freed
		_ = conn.Close()
	}
	waitFor(t, "tether's goroutines and heap back", func() bool {
		return c.metric(t, "tether_extproc_open_streams") == 0 && c.metric(t, "go_goroutines") < baseG+50 &&
			c.metric(t, "go_memstats_heap_inuse_bytes") < baseHeap+max(0.4*(peakHeap-baseHeap), 4e6)
	}, func() string {
		return fmt.Sprintf("open %.0f, goroutines %.0f (base %.0f), heap in use %.1f MB (base %.1f, peak %.1f), GCs %.0f",
			c.metric(t, "tether_extproc_open_streams"), c.metric(t, "go_goroutines"), baseG,
			c.metric(t, "go_memstats_heap_inuse_bytes")/1e6, baseHeap/1e6, peakHeap/1e6, c.metric(t, "go_gc_duration_seconds_count"))
	})
	endG, endHeap := c.metric(t, "go_goroutines"), c.metric(t, "go_memstats_heap_inuse_bytes")
	t.Logf("%d silent streams (%.0f open at once): goroutines %.0f -> %.0f -> %.0f, heap in use %.1f -> %.1f -> %.1f MB; all closed %v after the first opened, none sooner than %v after its own open (timeout 6s)",
		n, peakOpen, baseG, peakG, endG, baseHeap/1e6, peakHeap/1e6, endHeap/1e6, closedAfter.Round(100*time.Millisecond), shortest.Round(time.Millisecond))
	if peakOpen < 1 {
		t.Errorf("tether held no stream open at the peak for %d streams opened", n)
	}
}
