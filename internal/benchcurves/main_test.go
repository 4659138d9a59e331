package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRenderDrawsEverySeriesWithItsNotes(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	in := "# title: Decide <walk>\n# x: sessions\n# y: ns\n# note: 2 cores; load 3.1\n" +
		"tether\t1000\t800\ntether\t1000000\t1200\nbaseline\t1000\t600\nbaseline\t1000000\t900\n"
	path := filepath.Join(data, "decide.tsv")
	if err := os.WriteFile(path, []byte(in), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := render(path); err != nil {
		t.Fatal(err)
	}
	out, err := os.ReadFile(filepath.Join(dir, "decide.svg"))
	if err != nil {
		t.Fatal(err)
	}
	svg := string(out)
	for _, want := range []string{"Decide &lt;walk&gt;", ">tether<", ">baseline<", "2 cores; load 3.1", ">1k<", ">1M<"} {
		if !strings.Contains(svg, want) {
			t.Errorf("svg lacks %q", want)
		}
	}
	if n := strings.Count(svg, "<polyline"); n != 2 {
		t.Errorf("%d polylines, want one per series (2)", n)
	}
	// The same data draws the same picture.
	if err := render(path); err != nil {
		t.Fatal(err)
	}
	again, _ := os.ReadFile(filepath.Join(dir, "decide.svg"))
	if string(again) != svg {
		t.Error("rendering the same data twice gave different SVGs")
	}
}

func TestParseRejectsBadRows(t *testing.T) {
	for _, in := range []string{
		"",             // no data
		"a\t1\n",       // two fields
		"a\tx\t1\n",    // x not a number
		"a\t0\t1\n",    // x on a log axis must be > 0
		"a\t1\t-2\n",   // negative y
		"# title: t\n", // headers only
	} {
		if _, err := parse(strings.NewReader(in)); err == nil {
			t.Errorf("parse(%q) accepted it", in)
		}
	}
}
