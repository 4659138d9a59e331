package deploytest

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rhysd/actionlint"
)

var workflowDir = filepath.Join(root, ".github/workflows")

// TestWorkflows lints every GitHub Actions workflow with actionlint (syntax, expressions,
// job dependencies, runner labels, known actions' inputs; shellcheck and pyflakes integrations
// off: they are separate tools) and checks that one workflow runs `make test` and one runs
// `make e2e-envoy` against the official Envoy image. GitHub Actions cannot run here.
func TestWorkflows(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(workflowDir, "*.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 2 {
		t.Fatalf("workflows %v; want the test and the e2e-envoy workflows", files)
	}
	l, err := actionlint.NewLinter(io.Discard, &actionlint.LinterOptions{Shellcheck: "", Pyflakes: ""})
	if err != nil {
		t.Fatal(err)
	}
	errs, err := l.LintFiles(files, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range errs {
		t.Errorf("%s:%d:%d: %s [%s]", e.Filepath, e.Line, e.Column, e.Message, e.Kind)
	}

	runs := map[string][]string{} // file → run: lines
	images := map[string][]string{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		wf, perrs := actionlint.Parse(data)
		if len(perrs) > 0 {
			t.Fatalf("%s: %v", f, perrs[0])
		}
		for _, j := range wf.Jobs {
			if j.Container != nil && j.Container.Image != nil {
				images[filepath.Base(f)] = append(images[filepath.Base(f)], j.Container.Image.Value)
			}
			for _, s := range j.Steps {
				if r, ok := s.Exec.(*actionlint.ExecRun); ok && r.Run != nil {
					runs[filepath.Base(f)] = append(runs[filepath.Base(f)], r.Run.Value)
				}
			}
		}
	}
	has := func(file, cmd string) bool {
		return slices.ContainsFunc(runs[file], func(r string) bool { return strings.Contains(r, cmd) })
	}
	if !has("test.yml", "make test") {
		t.Errorf("test.yml runs %q; want make test", runs["test.yml"])
	}
	if !has("e2e-envoy.yml", "make e2e-envoy") {
		t.Errorf("e2e-envoy.yml runs %q; want make e2e-envoy", runs["e2e-envoy.yml"])
	}
}
