package main

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestDemo builds tether and the demo, runs the demo as `make demo` does (on free ports), runs
// the curl commands it prints in one bash, and checks that the intro, the commands and their
// output are what the README's quick start shows (session ids, ports and the demo directory
// aside): a session sticks, the third request at two request slots gets 429, and the fifth
// session goes to the standby instance, and the sessions on the standby come back to it (200,
// while it is full). Then it stops the demo with SIGINT and checks that the
// demo and tether exited and that nothing listens any more.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds and runs two binaries")
	}
	for _, tool := range []string{"bash", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed (make deps installs it): %v", tool, err)
		}
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	for _, b := range [][2]string{{"tether", "./cmd/tether"}, {"tether-demo", "./examples/demo"}} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(bin, b[0]), b[1])
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b[1], err, out)
		}
	}
	readme := readmeDemo(t, filepath.Join(root, "README.md"))

	dir := t.TempDir()
	demo := exec.Command(filepath.Join(bin, "tether-demo"), "-tether", filepath.Join(bin, "tether"),
		"-random-ports", "-dir", dir)
	demo.Dir = root
	stdout, err := demo.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	demo.Stderr = &stderr
	if err := demo.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		exited <- demo.Wait()
	}()
	t.Cleanup(func() {
		if demo.ProcessState == nil {
			_ = demo.Process.Kill()
		}
	})

	// The intro ends with the last command.
	var intro []string
	deadline := time.After(2 * time.Minute)
	for len(intro) == 0 || !strings.HasPrefix(intro[len(intro)-1], "curl -s -c "+dir+"/frank") {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("demo exited during start-up: %v\nstdout:\n%s\nstderr:\n%s", <-exited, strings.Join(intro, "\n"), stderr.String())
			}
			intro = append(intro, l)
		case <-deadline:
			t.Fatalf("demo did not print its commands in time; so far:\n%s\nstderr:\n%s", strings.Join(intro, "\n"), stderr.String())
		}
	}
	norm := normalizer(dir)
	if diff := cmp.Diff(norm(readme.intro), norm(strings.Join(intro, "\n"))); diff != "" {
		t.Errorf("the demo's intro differs from the README's (-README +demo):\n%s", diff)
	}

	// The dashboard the intro points at answers.
	if m := regexp.MustCompile(`dashboard   (http://\S+/ui/)`).FindStringSubmatch(strings.Join(intro, "\n")); m == nil {
		t.Error("the intro names no dashboard URL")
	} else if resp, err := http.Get(m[1]); err != nil {
		t.Errorf("dashboard %s: %v", m[1], err)
	} else {
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
			t.Errorf("dashboard %s: %d %s, want 200 text/html", m[1], resp.StatusCode, resp.Header.Get("Content-Type"))
		}
	}

	// The commands, in order, in one bash (the background requests and `wait` need one shell).
	var cmds []string
	started := false
	for _, l := range intro {
		if strings.HasPrefix(l, "Each instance") {
			started = true
			continue
		}
		if started && l != "" && !strings.HasPrefix(l, "#") {
			cmds = append(cmds, l)
		}
	}
	const marker = "@@@ end of command"
	var script strings.Builder
	for _, c := range cmds {
		script.WriteString(c + "\necho '" + marker + "'\n")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "bash", "-c", script.String()).CombinedOutput()
	if err != nil {
		t.Fatalf("the demo's commands: %v\n%s", err, out)
	}
	outs := strings.Split(strings.TrimSuffix(string(out), marker+"\n"), marker+"\n")
	if len(outs) != len(cmds) {
		t.Fatalf("%d outputs for %d commands:\n%s", len(outs), len(cmds), out)
	}
	var got strings.Builder
	for i, c := range cmds {
		got.WriteString("$ " + c + "\n" + outs[i])
	}
	if diff := cmp.Diff(norm(readme.session), norm(got.String())); diff != "" {
		t.Errorf("the commands or their output differ from the README's (-README +run):\n%s", diff)
	}
	// What the README shows, stated once more as behaviour (so a README edited to match a
	// regression still fails here).
	for _, want := range []string{
		"200 web-1  set-cookie: tether-session=",
		"web-1\nweb-1\nweb-1\n",
		"2 requests held\n429 retry-after: 1\nreleased 2 requests\n",
		"web-1\nweb-2\nweb-2\nweb-3\n",
		"web-3\n200 web-3\n200 web-3\n", // the standby's sessions come back to it, full as it is
	} {
		if !strings.Contains(strings.Join(outs, ""), want) {
			t.Errorf("the run does not show %q:\n%s", want, got.String())
		}
	}

	// Ctrl-C: everything the demo started stops.
	children := childPIDs(t, demo.Process.Pid)
	if len(children) == 0 {
		t.Fatal("the demo has no tether child process")
	}
	addrs := regexp.MustCompile(`127\.0\.0\.1:\d+`).FindAllString(strings.Join(intro, "\n"), -1)
	if err := demo.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	var tail []string
	for l := range lines {
		tail = append(tail, l)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("demo exited with %v after SIGINT\nstderr:\n%s", err, stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("demo did not exit after SIGINT")
	}
	if !strings.Contains(strings.Join(tail, "\n"), "demo stopped") {
		t.Errorf("demo's last words: %q", tail)
	}
	for _, pid := range children {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("process %d (started by the demo) still exists after the demo exited: %v", pid, err)
		}
	}
	for _, a := range addrs {
		if c, err := net.DialTimeout("tcp", a, time.Second); err == nil {
			_ = c.Close()
			t.Errorf("%s still accepts connections after the demo exited", a)
		}
	}
}

type readmeBlocks struct{ intro, session string }

// readmeDemo returns the two console blocks of the README's demo: what `make demo` prints
// (from "tether demo:" on) and the commands with their output ("$ " lines and what follows).
func readmeDemo(t *testing.T, path string) readmeBlocks {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	for _, part := range strings.Split(string(data), "```console\n")[1:] {
		end := strings.Index(part, "```")
		if end < 0 {
			t.Fatal("README: unterminated console block")
		}
		blocks = append(blocks, part[:end])
	}
	var b readmeBlocks
	for i, blk := range blocks {
		if strings.HasPrefix(blk, "$ make demo\n") && i+1 < len(blocks) {
			intro := blk[strings.Index(blk, "tether demo:"):]
			b.intro = strings.TrimSuffix(intro, "\n")
			b.session = blocks[i+1]
			return b
		}
	}
	t.Fatal("README: no ```console block starting with `$ make demo` followed by the commands' block")
	return b
}

// normalizer replaces what differs between runs: ports, session ids, the demo directory.
func normalizer(dir string) func(string) string {
	port := regexp.MustCompile(`127\.0\.0\.1:\d+`)
	id := regexp.MustCompile(`\b[0-9a-f]{32}\b`)
	tmp := regexp.MustCompile(`/tmp/tether-demo\b`)
	return func(s string) string {
		s = strings.ReplaceAll(s, dir, "DIR")
		s = tmp.ReplaceAllString(s, "DIR")
		s = port.ReplaceAllString(s, "127.0.0.1:PORT")
		return id.ReplaceAllString(s, "ID")
	}
}

// childPIDs lists the direct children of pid (Linux /proc).
func childPIDs(t *testing.T, pid int) []int {
	t.Helper()
	tasks, err := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/children")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, f := range tasks {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range strings.Fields(string(data)) {
			n, err := strconv.Atoi(f)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, n)
		}
	}
	return out
}
