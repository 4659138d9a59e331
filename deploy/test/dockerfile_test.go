package deploytest

import (
	"bytes"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/linter"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
)

// root is the repository root, relative to this package.
const root = "../.."

// parseDockerfile parses path with buildkit's Dockerfile parser and instruction set, failing
// the test on parse errors and on any warning of buildkit's Dockerfile checks.
func parseDockerfile(t *testing.T, path string) []instructions.Stage {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	res, err := parser.Parse(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	for _, w := range res.Warnings {
		t.Errorf("%s: parser warning: %s", path, w.Short)
	}
	lint := linter.New(&linter.Config{ExperimentalAll: true, Warn: func(rule, _, _, msg string, loc []parser.Range) {
		line := 0
		if len(loc) > 0 {
			line = loc[0].Start.Line
		}
		t.Errorf("%s:%d: buildkit check %s: %s", path, line, rule, msg)
	}})
	stages, _, err := instructions.Parse(res.AST, lint)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return stages
}

// TestDockerfile parses the Dockerfile with buildkit and checks the properties the image
// promises: a separate build stage, a static build (CGO_ENABLED=0), a distroless or scratch
// final stage holding only the binary, a numeric non-root USER, and an exec-form ENTRYPOINT.
// Docker itself cannot run here; TestDockerfileBinaryIsStatic runs the build command.
func TestDockerfile(t *testing.T) {
	stages := parseDockerfile(t, filepath.Join(root, "Dockerfile"))
	if len(stages) < 2 {
		t.Fatalf("%d stages; want a build stage and a runtime stage", len(stages))
	}
	final := stages[len(stages)-1]
	if !strings.HasPrefix(final.BaseName, "gcr.io/distroless/static") && final.BaseName != "scratch" {
		t.Errorf("final stage FROM %s; want distroless/static or scratch", final.BaseName)
	}
	var user, entrypoint string
	for _, c := range final.Commands {
		switch c := c.(type) {
		case *instructions.UserCommand:
			user = c.User
		case *instructions.EntrypointCommand:
			if c.PrependShell {
				t.Errorf("ENTRYPOINT in shell form (%v): distroless has no shell", c.CmdLine)
			}
			entrypoint = strings.Join(c.CmdLine, " ")
		case *instructions.RunCommand:
			t.Errorf("RUN in the final stage (%v): distroless has no shell", c.CmdLine)
		case *instructions.CopyCommand:
			if c.From == "" {
				t.Errorf("the final stage copies from the build context (%v); want only the build stage's binary", c.SourcePaths)
			}
		}
	}
	uid, _, _ := strings.Cut(user, ":")
	if uid == "" || uid == "0" || uid == "root" || strings.Trim(uid, "0123456789") != "" {
		t.Errorf("final USER %q; want a numeric non-root uid (Kubernetes runAsNonRoot checks it)", user)
	}
	if entrypoint != "/usr/local/bin/tether" {
		t.Errorf("ENTRYPOINT %q", entrypoint)
	}
	if build := buildCommand(t, stages); !strings.Contains(build, "CGO_ENABLED=0") {
		t.Errorf("the build RUN does not set CGO_ENABLED=0: %s", build)
	}
}

// buildCommand returns the shell command of the RUN that builds ./cmd/tether.
func buildCommand(t *testing.T, stages []instructions.Stage) string {
	t.Helper()
	for _, s := range stages[:len(stages)-1] {
		for _, c := range s.Commands {
			if r, ok := c.(*instructions.RunCommand); ok && r.PrependShell {
				if cmd := strings.Join(r.CmdLine, " "); strings.Contains(cmd, "./cmd/tether") {
					return cmd
				}
			}
		}
	}
	t.Fatal("no RUN builds ./cmd/tether")
	return ""
}

// TestDockerfileBinaryIsStatic runs the Dockerfile's own build command (its output path moved
// to a temporary directory) and checks the binary with debug/elf: no program interpreter and
// no dynamic section, so it runs on distroless/static or scratch.
func TestDockerfileBinaryIsStatic(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds tether")
	}
	stages := parseDockerfile(t, filepath.Join(root, "Dockerfile"))
	cmd := buildCommand(t, stages)
	out := t.TempDir()
	cmd = strings.ReplaceAll(cmd, "/out/", out+"/")
	sh := exec.Command("sh", "-c", cmd)
	sh.Dir = root
	sh.Env = append(os.Environ(), "TARGETOS=linux", "TARGETARCH=amd64", "VERSION=test")
	if b, err := sh.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, b)
	}
	bin := filepath.Join(out, "tether")
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("%s has a %v program header: not static", bin, p.Type)
		}
	}
	if f.Section(".dynamic") != nil || f.Section(".interp") != nil {
		t.Error("the binary has a .dynamic or .interp section: not static")
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("the binary imports %v", libs)
	}
	v, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil || !slices.Contains(strings.Fields(string(v)), "test") {
		t.Errorf("tether version: %q, %v; want the VERSION build arg", v, err)
	}
}

// TestDockerfileKamailio parses the converged example's Kamailio image with buildkit (failing
// on any buildkit check), checks it runs as a numeric non-root user with an exec-form
// ENTRYPOINT, and runs that ENTRYPOINT and CMD with `-c` on this machine's Kamailio (the same
// Debian packages): Kamailio checks the config with the image's defines and exits. Docker is
// not available here, so the image itself is not built.
func TestDockerfileKamailio(t *testing.T) {
	stages := parseDockerfile(t, filepath.Join(root, "examples/converged/Dockerfile.kamailio"))
	final := stages[len(stages)-1]
	var user string
	var entrypoint, cmd []string
	for _, c := range final.Commands {
		switch c := c.(type) {
		case *instructions.UserCommand:
			user = c.User
		case *instructions.EntrypointCommand:
			if c.PrependShell {
				t.Errorf("ENTRYPOINT in shell form: %v", c.CmdLine)
			}
			entrypoint = c.CmdLine
		case *instructions.CmdCommand:
			if c.PrependShell {
				t.Errorf("CMD in shell form: %v", c.CmdLine)
			}
			cmd = c.CmdLine
		case *instructions.CopyCommand:
			for _, src := range c.SourcePaths {
				if _, err := os.Stat(filepath.Join(root, src)); err != nil {
					t.Errorf("COPY %s: %v", src, err)
				}
			}
		}
	}
	if uid, _, _ := strings.Cut(user, ":"); uid == "" || uid == "0" || strings.Trim(uid, "0123456789") != "" {
		t.Errorf("USER %q; want a numeric non-root uid", user)
	}
	if len(entrypoint) == 0 || entrypoint[0] != "kamailio" {
		t.Fatalf("ENTRYPOINT %v; want kamailio", entrypoint)
	}
	if testing.Short() {
		t.Skip("-short: does not run kamailio")
	}
	bin, err := exec.LookPath("kamailio")
	if err != nil {
		t.Fatalf("kamailio (make deps installs it): %v", err)
	}
	args := append(append([]string{}, entrypoint[1:]...), cmd...)
	for i, a := range args {
		if a == "/etc/kamailio/kamailio.cfg" {
			args[i] = filepath.Join(root, "examples/converged/kamailio.cfg")
		}
	}
	out, err := exec.Command(bin, append(args, "-c")...).CombinedOutput()
	if err != nil {
		t.Fatalf("kamailio %v -c: %v\n%s", args, err, out)
	}
	if !bytes.Contains(out, []byte("0.0.0.0 [0.0.0.0]:5060")) {
		t.Errorf("kamailio does not listen on 0.0.0.0:5060 with the image's defines:\n%s", out)
	}
}
