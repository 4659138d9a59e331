package replicatest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// BuildTetherAt returns the tether binary of commit rev (a revision of this repository's git
// history), building it once into the user's cache (~/.cache/tether/builds/<sha>/tether) from
// `git archive` of that commit. It skips the test, saying why, when git or the history is not
// there (a source tarball) or rev is not in it. The build runs under nice: it takes minutes on
// a loaded machine the first time.
func BuildTetherAt(t testing.TB, rev string) string {
	t.Helper()
	git, err := exec.LookPath("git")
	if err != nil {
		t.Skipf("replicatest: no git to build tether at %s from the history: %v", rev, err)
	}
	sha, err := exec.Command(git, "rev-parse", "--verify", "--quiet", rev+"^{commit}").Output()
	if err != nil {
		t.Skipf("replicatest: commit %s is not in this checkout's git history (a shallow clone or a tarball): %v", rev, err)
	}
	id := strings.TrimSpace(string(sha))
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(cache, "tether", "builds", id)
	bin := filepath.Join(dir, "tether")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	src, err := os.MkdirTemp("", "tether-src-"+id[:7]+"-")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = os.RemoveAll(src) }()
	archive := exec.Command(git, "archive", id)
	untar := exec.Command("tar", "-x", "-C", src)
	var aerr, terr bytes.Buffer
	archive.Stderr, untar.Stderr = &aerr, &terr
	if untar.Stdin, err = archive.StdoutPipe(); err != nil {
		t.Fatal(err)
	}
	if err := untar.Start(); err != nil {
		t.Fatal(err)
	}
	if err := archive.Run(); err != nil {
		t.Fatalf("git archive %s: %v\n%s", id, err, aerr.String())
	}
	if err := untar.Wait(); err != nil {
		t.Fatalf("untar %s: %v\n%s", id, err, terr.String())
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := bin + ".tmp"
	build := exec.Command("nice", "-n", "15", "go", "build", "-o", tmp, "./cmd/tether")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building tether at %s: %v\n%s", id, err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		t.Fatal(err)
	}
	t.Logf("built tether at %s into %s", id[:12], bin)
	return bin
}
