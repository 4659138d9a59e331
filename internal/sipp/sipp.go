// Package sipp is the test harness for tether's SIP half: it runs real Kamailio and SIPp
// processes on loopback for integration tests — Kamailio with a given configuration, SIPp UAS
// instances that record every message they receive, and a SIPp UAC that places calls through
// the proxy.
//
// Tests call Require first: without the binaries a test is skipped with a clear message, unless
// the CI environment variable is set, where it fails instead (CI must install kamailio,
// kamailio-utils-modules and sip-tester).
package sipp

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Binaries the harness runs.
const (
	KamailioBin = "/usr/sbin/kamailio"
	SIPpBin     = "/usr/bin/sipp"
)

// HTTPClientModuleGlob finds Kamailio's http_client module (Debian package
// kamailio-utils-modules), which the converged example configuration loads.
const HTTPClientModuleGlob = "/usr/lib/*/kamailio/modules/http_client.so"

// scenarioFS holds the SIPp scenarios the harness runs.
//
//go:embed scenarios/*.xml
var scenarioFS embed.FS

// Scenarios. A UAS scenario's name ends in -uas, a UAC's in -uac; each UAC has its UAS.
const (
	// ScenarioBasic: INVITE, 180, 200 (echoing Record-Route), ACK, BYE (uac.xml, uas.xml).
	ScenarioBasic = ""
	// ScenarioDialog: a whole dialog — INVITE, ACK, a pause (UACOptions.Hold), re-INVITE, ACK,
	// UPDATE, BYE.
	ScenarioDialog = "dialog"
	// ScenarioCancel: INVITE, 180, CANCEL, 200 to the CANCEL, 487, ACK.
	ScenarioCancel = "cancel"
	// ScenarioHold: as ScenarioBasic, the call held up for UACOptions.Hold before the BYE (UAC
	// only; its UAS is ScenarioBasic's).
	ScenarioHold = "hold"
	// ScenarioByeOnly is a UAS that answers an in-dialog BYE of a call it did not set up (the
	// stand-in for an instance holding a replicated dialog).
	ScenarioByeOnly = "bye"
)

// writeScenario writes scenario name's role ("uas" or "uac") file into dir and returns its path.
func writeScenario(t testing.TB, dir, name, role string) string {
	t.Helper()
	file := role + ".xml"
	if name != "" {
		file = name + "-" + role + ".xml"
	}
	data, err := scenarioFS.ReadFile("scenarios/" + file)
	if err != nil {
		t.Fatalf("sipp: no %s scenario %q: %v", role, name, err)
	}
	p := filepath.Join(dir, file)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// Require skips t when Kamailio (with its http_client module) or SIPp is missing, or fails it
// when the CI environment variable is set.
func Require(t testing.TB) {
	t.Helper()
	var missing []string
	for _, bin := range []string{KamailioBin, SIPpBin} {
		if _, err := os.Stat(bin); err != nil {
			missing = append(missing, bin)
		}
	}
	if m, _ := filepath.Glob(HTTPClientModuleGlob); len(m) == 0 {
		missing = append(missing, HTTPClientModuleGlob)
	}
	if len(missing) == 0 {
		return
	}
	msg := fmt.Sprintf("missing %s; install with: apt-get install kamailio kamailio-utils-modules sip-tester", strings.Join(missing, ", "))
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// FreeUDPPort returns a UDP port on 127.0.0.1 that was free a moment ago.
func FreeUDPPort(t testing.TB) int {
	t.Helper()
	c, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("sipp: free port: %v", err)
	}
	port := c.LocalAddr().(*net.UDPAddr).Port
	if err := c.Close(); err != nil {
		t.Fatalf("sipp: free port: %v", err)
	}
	return port
}

// waitUDPBound waits until something is bound to 127.0.0.1:port (binding it fails), i.e. the
// process under test listens.
func waitUDPBound(ctx context.Context, port int, p *proc) error {
	for {
		if p.exited() {
			return fmt.Errorf("%s exited before listening on udp 127.0.0.1:%d", p.name, port)
		}
		c, err := net.ListenPacket("udp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			return nil
		}
		if err := c.Close(); err != nil {
			return fmt.Errorf("probe udp 127.0.0.1:%d: %w", port, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("nothing listens on udp 127.0.0.1:%d: %w", port, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// proc is a started child process in its own process group, stopped at test cleanup.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
	err  error
}

func start(t testing.TB, name string, args []string, dir string) *proc {
	t.Helper()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("sipp: start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, out: out, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("%s output (last 4 KiB):\n%s", name, tail(out.String(), 4096))
		}
	})
	return p
}

// stop ends the process group: SIGTERM, then SIGKILL after 3 s.
func (p *proc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(3 * time.Second):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
	}
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Kamailio is a running Kamailio.
type Kamailio struct {
	// Addr is the SIP listen address, "127.0.0.1:port" (UDP).
	Addr string
	Port int
	p    *proc
}

// KamailioOptions configures StartKamailio.
type KamailioOptions struct {
	// Config is the configuration file.
	Config string
	// Defines are passed as -A NAME=VALUE (string values must carry their own quotes). LISTEN
	// is set by StartKamailio.
	Defines map[string]string
}

// StartKamailio runs Kamailio in the foreground (-DD -E) on a free loopback UDP port with a
// private runtime directory, and waits until it listens. It is stopped when the test ends.
func StartKamailio(t testing.TB, o KamailioOptions) *Kamailio {
	t.Helper()
	// The free port is free only "a moment ago": another process (a SIPp's RTP socket) may
	// take it before Kamailio binds it, and Kamailio exits. Try again on a new port.
	var lastErr error
	var lastOut string
	for range 3 {
		port := FreeUDPPort(t)
		dir := t.TempDir()
		args := []string{KamailioBin, "-DD", "-E", "-f", o.Config, "-Y", dir, "-m", "64", "-M", "8",
			"-A", "LISTEN=udp:127.0.0.1:" + strconv.Itoa(port)}
		for _, k := range sortedKeys(o.Defines) {
			args = append(args, "-A", k+"="+o.Defines[k])
		}
		p := start(t, "kamailio", args, dir)
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		err := waitUDPBound(ctx, port, p)
		cancel()
		if err == nil {
			return &Kamailio{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, p: p}
		}
		exited := p.exited()
		p.stop()
		lastErr, lastOut = err, p.out.String()
		if !exited {
			break // it hangs rather than failing to bind: retrying will not help
		}
	}
	t.Fatalf("sipp: kamailio did not start (%v):\n%s", lastErr, tail(lastOut, 4096))
	return nil
}

// Log returns Kamailio's output so far.
func (k *Kamailio) Log() string { return k.p.out.String() }

// UAS is a running SIPp UAS that answers calls and records what it receives.
type UAS struct {
	Name string
	Port int
	// MessageFile is SIPp's message trace.
	MessageFile string
	p           *proc
}

// StartUAS runs a SIPp UAS (scenario scenarios/uas.xml: 180, 200 echoing Record-Route, then
// ACK and BYE) on 127.0.0.1 at a free port.
func StartUAS(t testing.TB, name string) *UAS { return StartUASScenario(t, name, ScenarioBasic) }

// StartUASScenario runs a SIPp UAS playing scenario (one of the Scenario constants) on
// 127.0.0.1 at a free port.
func StartUASScenario(t testing.TB, name, scenario string) *UAS {
	t.Helper()
	// As for Kamailio: a port free a moment ago may be taken before SIPp binds it (errno 98
	// seen at load 35), and SIPp exits; try again on new ports.
	var lastErr error
	var lastOut string
	for range 3 {
		dir := t.TempDir()
		scen := writeScenario(t, dir, scenario, "uas")
		port, mport := FreeUDPPort(t), FreeUDPPort(t)
		u := &UAS{Name: name, Port: port, MessageFile: filepath.Join(dir, "messages.log")}
		args := []string{SIPpBin, "-sf", scen, "-i", "127.0.0.1", "-p", strconv.Itoa(port), "-mp", strconv.Itoa(mport),
			"-nostdin", "-trace_msg", "-message_file", u.MessageFile, "-trace_err", "-error_file", filepath.Join(dir, "errors.log")}
		u.p = start(t, "sipp uas "+name, args, dir)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := waitUDPBound(ctx, port, u.p)
		cancel()
		if err == nil {
			return u
		}
		exited := u.p.exited()
		u.p.stop()
		lastErr, lastOut = err, u.p.out.String()
		if !exited {
			break // it hangs rather than failing to bind: retrying will not help
		}
	}
	t.Fatalf("sipp: UAS %s did not start (%v):\n%s", name, lastErr, tail(lastOut, 4096))
	return nil
}

// Stop ends the UAS.
func (u *UAS) Stop() { u.p.stop() }

// Message is one SIP message a SIPp instance received.
type Message struct {
	// Method is the request method, "" for a response.
	Method string
	// StartLine is the request or status line.
	StartLine string
	CallID    string
	// Raw is the message text.
	Raw string
}

// Received parses the UAS's message trace and returns the messages it received, in order.
func (u *UAS) Received() ([]Message, error) {
	data, err := os.ReadFile(u.MessageFile)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	return ParseMessageLog(data), nil
}

// ParseMessageLog extracts the received messages from a SIPp -message_file trace: blocks
// separated by "-----…- <timestamp>" lines, each starting with "UDP message received [n]
// bytes :" or "… message sent …".
func ParseMessageLog(data []byte) []Message {
	var out []Message
	for _, block := range strings.Split(string(data), "\n-----------------------------------------------") {
		lines := strings.Split(strings.ReplaceAll(block, "\r\n", "\n"), "\n")
		i := 0
		for i < len(lines) && !strings.Contains(lines[i], " message ") {
			i++
		}
		if i >= len(lines) || !strings.Contains(lines[i], "message received") {
			continue
		}
		i++
		for i < len(lines) && strings.TrimSpace(lines[i]) == "" {
			i++
		}
		if i >= len(lines) {
			continue
		}
		m := Message{StartLine: strings.TrimSpace(lines[i]), Raw: strings.Join(lines[i:], "\r\n")}
		if !strings.HasPrefix(m.StartLine, "SIP/2.0 ") {
			m.Method, _, _ = strings.Cut(m.StartLine, " ")
		}
		for _, l := range lines[i+1:] {
			if strings.TrimSpace(l) == "" {
				break
			}
			name, value, ok := strings.Cut(l, ":")
			if !ok {
				continue
			}
			if n := strings.ToLower(strings.TrimSpace(name)); n == "call-id" || n == "i" {
				m.CallID = strings.TrimSpace(value)
				break
			}
		}
		out = append(out, m)
	}
	return out
}

// UACOptions configures RunUAC.
type UACOptions struct {
	// Target is the proxy's "ip:port".
	Target string
	// Service is SIPp's -s: call n goes to sip:<Service><n>@target.
	Service string
	// Calls is the number of calls (-m); Rate is calls per second (-r); Limit caps simultaneous
	// calls (-l, default Calls).
	Calls, Rate, Limit int
	// Timeout bounds the run (SIPp -timeout; default 40 s).
	Timeout time.Duration
	// Scenario is one of the Scenario constants (default ScenarioBasic).
	Scenario string
	// Hold is how long ScenarioDialog and ScenarioHold hold each call up (SIPp -d).
	Hold time.Duration
}

// UACResult is what a UAC run reports.
type UACResult struct {
	// ExitCode is SIPp's: 0 every call succeeded, 1 some failed.
	ExitCode int
	// Output is SIPp's screen output; Errors its unexpected-message log.
	Output, Errors string
	// Received is every message the UAC received (responses), for diagnostics.
	Received []Message
}

// RunUAC places calls through the proxy with o.Scenario's UAC and waits for SIPp to finish.
func RunUAC(t testing.TB, o UACOptions) UACResult {
	t.Helper()
	dir := t.TempDir()
	scen := writeScenario(t, dir, o.Scenario, "uac")
	if o.Limit == 0 {
		o.Limit = o.Calls
	}
	if o.Timeout == 0 {
		o.Timeout = 40 * time.Second
	}
	msgFile, errFile := filepath.Join(dir, "messages.log"), filepath.Join(dir, "errors.log")
	args := []string{SIPpBin, "-sf", scen, "-s", o.Service, "-i", "127.0.0.1",
		"-p", strconv.Itoa(FreeUDPPort(t)), "-mp", strconv.Itoa(FreeUDPPort(t)),
		"-m", strconv.Itoa(o.Calls), "-r", strconv.Itoa(o.Rate), "-l", strconv.Itoa(o.Limit),
		"-timeout", strconv.Itoa(int(o.Timeout/time.Second)) + "s", "-timeout_error", "-recv_timeout", "5000",
		"-nostdin", "-trace_msg", "-message_file", msgFile, "-trace_err", "-error_file", errFile}
	if o.Hold > 0 {
		args = append(args, "-d", strconv.Itoa(int(o.Hold/time.Millisecond)))
	}
	args = append(args, o.Target)
	ctx, cancel := context.WithTimeout(context.Background(), o.Timeout+10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	res := UACResult{Output: out.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		res.ExitCode = ee.ExitCode()
	default:
		t.Fatalf("sipp: UAC: %v\n%s", err, out.String())
	}
	if b, err := os.ReadFile(errFile); err == nil {
		res.Errors = string(b)
	}
	if b, err := os.ReadFile(msgFile); err == nil {
		res.Received = ParseMessageLog(b)
	}
	return res
}

// syncBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.b.Len() > 1<<20 { // keep the last MiB at most
		rest := s.b.Bytes()[s.b.Len()-(1<<19):]
		s.b = *bytes.NewBuffer(append([]byte(nil), rest...))
	}
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// tail returns the last n bytes of s, from a line start.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[len(s)-n:]
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }
