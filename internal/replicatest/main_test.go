package replicatest_test

import (
	"os"
	"testing"

	"github.com/tether-dev/tether/internal/replicatest"
)

// TestMain removes the tether binary the process tests built (once per run).
func TestMain(m *testing.M) {
	code := m.Run()
	replicatest.RemoveBuilt()
	os.Exit(code)
}
