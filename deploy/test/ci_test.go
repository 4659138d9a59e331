package deploytest

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rhysd/actionlint"
)

// TestChecksRunnerRunsEveryCheck runs .ci/checks.sh (what `make test` runs its checks with) on
// checks that fail in the middle: every check runs, the summary lists each with its result, and
// the exit status is 1.
func TestChecksRunnerRunsEveryCheck(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(filepath.Join(root, ".ci/checks.sh"),
		"first", "echo ran-first",
		"second", "echo ran-second; exit 3",
		"third", "touch "+filepath.Join(dir, "third"),
		"fourth", "false | true && false",
	)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("exit %v, want 1\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "third")); err != nil {
		t.Errorf("the check after a failure did not run: %v", err)
	}
	s := string(out)
	summary := s[strings.Index(s, "=== summary"):]
	for _, want := range []string{"ran-first", "ran-second", "=== summary: 2 of 4 checks passed",
		"ok    first (", "FAIL  second (0s, exit 3)", "ok    third (", "FAIL  fourth (0s, exit 1)"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(summary, "ran-") {
		t.Errorf("the summary repeats the checks' output:\n%s", summary)
	}
	if out, err := exec.Command(filepath.Join(root, ".ci/checks.sh"), "ok", "true").CombinedOutput(); err != nil {
		t.Errorf("all checks passing: %v\n%s", err, out)
	}
}

// TestKubeCacheKeyedByVersion: CI caches the kube-apiserver and etcd builds under the versions
// .ci/kubebins.sh builds (read from internal/kubetest/*/go.mod), not under a script's hash.
func TestKubeCacheKeyedByVersion(t *testing.T) {
	out, err := exec.Command(filepath.Join(root, ".ci/kubebins.sh"), "--key").Output()
	if err != nil {
		t.Fatal(err)
	}
	key := strings.TrimSpace(string(out))
	for _, f := range []string{"internal/kubetest/apiserver/go.mod", "internal/kubetest/etcd/go.mod"} {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, part := range strings.Split(key, "-") {
			if strings.HasPrefix(part, "v") && strings.Contains(string(data), " "+part+"\n") {
				found = true
			}
		}
		if !found {
			t.Errorf("key %q names no version required in %s", key, f)
		}
	}
	data, err := os.ReadFile(filepath.Join(workflowDir, "test.yml"))
	if err != nil {
		t.Fatal(err)
	}
	wf, errs := actionlint.Parse(data)
	if len(errs) > 0 {
		t.Fatal(errs[0])
	}
	var cacheKey, keyRun string
	for _, j := range wf.Jobs {
		for _, s := range j.Steps {
			switch e := s.Exec.(type) {
			case *actionlint.ExecAction:
				if strings.HasPrefix(e.Uses.Value, "actions/cache@") {
					cacheKey = e.Inputs["key"].Value.Value
				}
			case *actionlint.ExecRun:
				if s.ID != nil && s.ID.Value == "kube" {
					keyRun = e.Run.Value
				}
			}
		}
	}
	if !strings.Contains(keyRun, ".ci/kubebins.sh --key") || !strings.Contains(cacheKey, "steps.kube.outputs.key") || strings.Contains(cacheKey, "hashFiles") {
		t.Errorf("test.yml caches under %q (step kube runs %q); want the key .ci/kubebins.sh --key prints", cacheKey, keyRun)
	}
}
