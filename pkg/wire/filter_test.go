package wire_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/tether-dev/tether/pkg/wire"
)

var update = flag.Bool("update", false, "rewrite "+wire.FilterContractFile+" (make generate)")

// TestFilterContractFile: the committed JSON rendering of the filter contract, which the
// recipes' checks read (deploy/recipetest does not import tether), is FilterContract's.
func TestFilterContractFile(t *testing.T) {
	b, err := json.MarshalIndent(wire.FilterContract(), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	b = append(b, '\n')
	path := filepath.Join("..", "..", wire.FilterContractFile)
	if *update {
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, b) {
		t.Errorf("%s is stale: run make generate\nwant:\n%s", wire.FilterContractFile, b)
	}
}
