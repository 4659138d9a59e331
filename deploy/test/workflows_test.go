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

// TestReleaseWorkflow: release.yml runs on version tags only, builds the Dockerfile for
// linux/amd64 and linux/arm64, pushes to GHCR with an SBOM and provenance, attests the pushed
// digest, and puts that digest into the release notes it publishes with the SBOM attached.
func TestReleaseWorkflow(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(workflowDir, "release.yml"))
	if err != nil {
		t.Fatal(err)
	}
	wf, errs := actionlint.Parse(data)
	if len(errs) > 0 {
		t.Fatal(errs[0])
	}
	push, ok := wf.On[0].(*actionlint.WebhookEvent)
	if !ok || len(wf.On) != 1 || push.EventName() != "push" || push.Tags.IsEmpty() || len(push.Tags.Values) != 1 || push.Tags.Values[0].Value != "v*" || !push.Branches.IsEmpty() {
		t.Errorf("release.yml triggers %+v; want push of v* tags only", wf.On)
	}
	uses := map[string]map[string]string{}
	var runs []string
	for _, j := range wf.Jobs {
		for _, s := range j.Steps {
			switch e := s.Exec.(type) {
			case *actionlint.ExecAction:
				in := map[string]string{}
				for k, v := range e.Inputs {
					in[k] = v.Value.Value
				}
				uses[strings.Split(e.Uses.Value, "@")[0]] = in
			case *actionlint.ExecRun:
				runs = append(runs, e.Run.Value)
			}
		}
	}
	b := uses["docker/build-push-action"]
	if b == nil || b["platforms"] != "linux/amd64,linux/arm64" || b["push"] != "true" || b["sbom"] != "true" || !strings.HasPrefix(b["provenance"], "mode=max") {
		t.Errorf("build-push-action inputs %v; want both platforms, push, sbom and max provenance", b)
	}
	if l := uses["docker/login-action"]; l == nil || l["registry"] != "ghcr.io" {
		t.Errorf("login-action inputs %v; want ghcr.io", l)
	}
	if a := uses["actions/attest-build-provenance"]; a == nil || !strings.Contains(a["subject-digest"], "steps.build.outputs.digest") {
		t.Errorf("attest-build-provenance inputs %v; want the pushed digest", a)
	}
	all := strings.Join(runs, "\n")
	if !strings.Contains(all, "gh release create") || !strings.Contains(all, "${DIGEST}") || !strings.Contains(all, ".spdx.json") {
		t.Errorf("release.yml does not publish a release with the digest in its notes and the SBOM attached:\n%s", all)
	}
	if !strings.Contains(string(data), "DIGEST: ${{ steps.build.outputs.digest }}") {
		t.Error("the notes' DIGEST is not the build step's digest")
	}
}
