// Package redistest runs real redis-server and redis-sentinel processes (Debian packages
// redis-server and redis-sentinel) on loopback, on ephemeral ports, for tests: a single server
// (optionally with AOF), a Redis Cluster (three primaries, optionally each with a replica;
// cluster.go), and a primary/replica pair watched by one Sentinel. Every process is stopped by t.Cleanup. No test ever binds 6379.
//
// Tests call Require first: without the binaries a test is skipped with a clear message, unless
// the CI environment variable is set, where it fails instead (.ci/deps.sh installs them).
package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Binaries the harness runs.
const (
	ServerBin   = "/usr/bin/redis-server"
	SentinelBin = "/usr/bin/redis-sentinel"
	CLIBin      = "/usr/bin/redis-cli"
)

// Require skips t when redis-server, redis-sentinel or redis-cli is missing, or fails it when
// the CI environment variable is set (or when run without -short... only CI makes it fatal).
func Require(t testing.TB) {
	t.Helper()
	var missing []string
	for _, bin := range []string{ServerBin, SentinelBin, CLIBin} {
		if _, err := os.Stat(bin); err != nil {
			missing = append(missing, bin)
		}
	}
	if len(missing) == 0 {
		return
	}
	msg := fmt.Sprintf("redistest: missing %s (Debian packages redis-server and redis-sentinel; .ci/deps.sh installs them)", strings.Join(missing, ", "))
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// Server is one running redis-server (or redis-sentinel).
type Server struct {
	t    testing.TB
	Addr string // 127.0.0.1:port
	Dir  string // its working directory (AOF, RDB, nodes.conf)
	args []string
	bin  string
	cmd  *exec.Cmd
	done chan struct{}
}

// Option adds redis-server configuration.
type Option func(*[]string)

// WithAOF turns on the append-only file with the given appendfsync policy (always, everysec,
// no).
func WithAOF(fsync string) Option {
	return func(a *[]string) { *a = append(*a, "--appendonly", "yes", "--appendfsync", fsync) }
}

// WithArgs adds raw redis-server arguments ("--name", "value", ...).
func WithArgs(args ...string) Option {
	return func(a *[]string) { *a = append(*a, args...) }
}

// Start runs a redis-server on an ephemeral loopback port and waits until it answers PING.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	Require(t)
	var extra []string
	for _, o := range opts {
		o(&extra)
	}
	return start(t, ServerBin, t.TempDir(), extra, "")
}

func start(t testing.TB, bin, dir string, extra []string, conf string) *Server {
	t.Helper()
	var lastErr error
	for range 5 {
		port, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		s := &Server{t: t, Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Dir: dir, bin: bin}
		if conf != "" {
			s.args = append(s.args, conf)
		}
		s.args = append(s.args, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
			"--save", "", "--daemonize", "no", "--protected-mode", "no", "--loglevel", "warning",
			"--logfile", filepath.Join(dir, "redis.log"))
		s.args = append(s.args, extra...)
		if lastErr = s.run(); lastErr == nil {
			t.Cleanup(s.Stop)
			return s
		}
	}
	t.Fatalf("redistest: starting %s: %v", bin, lastErr)
	return nil
}

// StartTLS runs a redis-server that also listens with TLS (returned: its host:port) on a second
// ephemeral port, with the server certificate certFile/keyFile; clients must present a
// certificate signed by caFile (tls-auth-clients yes). The plain port (Server.Addr) stays for
// the harness's own PING and redis-cli.
func StartTLS(t testing.TB, caFile, certFile, keyFile string) (*Server, string) {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	s := Start(t, WithArgs("--tls-port", strconv.Itoa(port), "--tls-cert-file", certFile, "--tls-key-file", keyFile,
		"--tls-ca-cert-file", caFile, "--tls-auth-clients", "yes"))
	return s, net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// freePort asks the kernel for a free port. Another process may take it before the server
// binds it; start retries with a new port then.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) run() error {
	s.cmd = exec.Command(s.bin, s.args...)
	s.cmd.Dir = s.Dir
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return err
	}
	s.done = make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(s.done) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := ping(s.Addr); err == nil {
			return nil
		}
		select {
		case <-s.done:
			return fmt.Errorf("%s exited at start: %s", s.bin, s.Log())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.Kill()
			return fmt.Errorf("%s did not answer PING within 10s: %s", s.bin, s.Log())
		}
	}
}

// Log returns the server's log file.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
	return string(b)
}

// Stop ends the server gracefully (SIGTERM: an AOF is flushed) and waits for it.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		s.Kill()
	}
}

// Kill ends the server with SIGKILL (a crash: nothing is flushed) and waits for it.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
}

// Pause stops the server with SIGSTOP (a hung Redis: connections stay open, nothing is
// answered) until Resume.
func (s *Server) Pause() { _ = s.cmd.Process.Signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT): it answers what was queued meanwhile.
func (s *Server) Resume() { _ = s.cmd.Process.Signal(syscall.SIGCONT) }

// Restart starts the server again on the same port and directory (its AOF is replayed).
func (s *Server) Restart() {
	s.t.Helper()
	var err error
	for range 50 { // the port may take a moment to be free again
		if err = s.run(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.t.Fatalf("redistest: restarting %s: %v", s.Addr, err)
}

// Do runs one command with redis-cli against the server and returns its raw output.
func (s *Server) Do(args ...string) (string, error) {
	return cli(s.Addr, args...)
}

func cli(addr string, args ...string) (string, error) {
	host, port, _ := net.SplitHostPort(addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, CLIBin, append([]string{"-h", host, "-p", port}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("redis-cli %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

// ping sends PING over a raw connection (no client library).
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return errors.New("not ready: " + strings.TrimSpace(line))
	}
	return nil
}

// CommandCalls returns the calls counted by INFO commandstats per command (lower case, e.g.
// "evalsha", "hgetall").
func (s *Server) CommandCalls() (map[string]int64, error) {
	out, err := s.Do("INFO", "commandstats")
	if err != nil {
		return nil, err
	}
	calls := map[string]int64{}
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":calls=")
		if !ok || !strings.HasPrefix(line, "cmdstat_") {
			continue
		}
		n, _, _ := strings.Cut(rest, ",")
		v, err := strconv.ParseInt(n, 10, 64)
		if err == nil {
			calls[name] = v
		}
	}
	return calls, nil
}

// CommandTotal returns how many commands the server has run (INFO commandstats, scripts'
// inner calls included), leaving out INFO itself (the counting) and the commands named in
// except (lower case; a name ending in "|" leaves out every subcommand, e.g. "client|").
func (s *Server) CommandTotal(except ...string) (int64, error) {
	calls, err := s.CommandCalls()
	if err != nil {
		return 0, err
	}
	var n int64
	for name, c := range calls {
		if name == "info" || slices.ContainsFunc(except, func(x string) bool {
			return name == x || strings.HasSuffix(x, "|") && strings.HasPrefix(name, x)
		}) {
			continue
		}
		n += c
	}
	return n, nil
}

// Sentinel is a primary, one replica and one Sentinel watching them as master set MasterSet.
type Sentinel struct {
	Primary, Replica, Sentinel *Server
	MasterSet                  string
}

// StartSentinel runs a primary (with opts), a replica of it, and a Sentinel (quorum 1,
// down-after 1 s) and waits until the Sentinel knows the replica.
func StartSentinel(t testing.TB, opts ...Option) *Sentinel {
	t.Helper()
	return StartSentinelDownAfter(t, time.Second, opts...)
}

// StartSentinelDownAfter is StartSentinel with the Sentinel's down-after-milliseconds: how long
// the primary may not answer before it fails over. Schedules of many failovers on a loaded
// machine want a few seconds, or a Sentinel that waited too long for a PING reply fails the new
// primary over again at once.
func StartSentinelDownAfter(t testing.TB, downAfter time.Duration, opts ...Option) *Sentinel {
	t.Helper()
	Require(t)
	var extra []string
	for _, o := range opts {
		o(&extra)
	}
	p := start(t, ServerBin, t.TempDir(), extra, "")
	rep := start(t, ServerBin, t.TempDir(), append(append([]string{}, extra...), "--replicaof", "127.0.0.1", portOf(p.Addr)), "")
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	const set = "tether"
	body := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %s 1\nsentinel down-after-milliseconds %s %d\nsentinel failover-timeout %s 5000\nsentinel parallel-syncs %s 1\n",
		set, portOf(p.Addr), set, downAfter.Milliseconds(), set, set)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	sn := start(t, SentinelBin, dir, nil, conf)
	s := &Sentinel{Primary: p, Replica: rep, Sentinel: sn, MasterSet: set}
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, _ := sn.Do("SENTINEL", "REPLICAS", set)
		if strings.Contains(out, portOf(rep.Addr)) {
			if info, _ := rep.Do("INFO", "replication"); strings.Contains(info, "master_link_status:up") {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: sentinel does not see the replica: %s", out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// PrimaryAddr asks the Sentinel for the current primary's address.
func (s *Sentinel) PrimaryAddr() (string, error) {
	out, err := s.Sentinel.Do("SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.MasterSet)
	if err != nil {
		return "", err
	}
	f := strings.Fields(out)
	if len(f) != 2 {
		return "", fmt.Errorf("unexpected reply %q", out)
	}
	return net.JoinHostPort(f[0], f[1]), nil
}

func portOf(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}
