package ring

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestFastGenUpToDate: fast_gen.go is what gen_fast.go makes of its
// template (go generate ./cq/ring after editing the template).
func TestFastGenUpToDate(t *testing.T) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		goCmd = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	out := filepath.Join(t.TempDir(), "fast_gen.txt") // not .go: go run would take it as a source file
	cmd := exec.Command(goCmd, "run", "gen_fast.go", out)
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", b)
	want, err := os.ReadFile(out)
	require.NoError(t, err)
	got, err := os.ReadFile("fast_gen.go")
	require.NoError(t, err)
	require.Equal(t, string(want), string(got), "fast_gen.go is stale: run go generate ./cq/ring")
}
