package qemu

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// readmeSnippets returns README.md's Go snippets: the server (serve and
// main) and the host side of a guest test (the qemu.Config and the
// RunGoTestT call), as README shows them.
func readmeSnippets(t *testing.T, readme string) (server, host string) {
	t.Helper()
	for _, m := range regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(readme, -1) {
		switch {
		case strings.Contains(m[1], "func serve("):
			server = m[1]
		case strings.Contains(m[1], "qemu.RunGoTestT("):
			host = m[1]
		}
	}
	require.NotEmpty(t, server, "README's serve snippet")
	require.NotEmpty(t, host, "README's RunGoTestT snippet")
	return server, host
}

// outsideServer wraps README's server snippet into a main package: the
// imports it names, the driver import README says to add, and handle.
const outsideServer = `package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"sync/atomic"
	"time"

	"github.com/vfnic/vfnic/nic"
	_ "github.com/vfnic/vfnic/nic/virtio" // registers the driver, as README says
)

// frames counts what handle was given.
var frames atomic.Int64

func handle(b []byte) { frames.Add(1) }

`

// outsideGuestTest runs serve in the guest on the NIC bound to vfio-pci
// while the guest's Linux NIC on the same wire asks for a neighbour (ARP
// broadcasts), until serve has handled a frame.
const outsideGuestTest = `package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/vfnic/vfnic/qemu"
)

func TestGuestServe(t *testing.T) {
	qemu.SkipUnlessGuest(t)
	nics, err := qemu.GuestNICs()
	if err != nil {
		t.Fatal(err)
	}
	addr := ""
	for _, n := range nics {
		if n.Bind == qemu.BindVFIO {
			addr = n.GuestAddr()
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- serve(ctx, addr) }()
	for frames.Load() == 0 && ctx.Err() == nil {
		// The kernel asks who has 10.0.0.77 (a broadcast) on the wire.
		if c, err := net.Dial("udp4", "10.0.0.77:9"); err == nil {
			_, _ = c.Write([]byte("hello"))
			c.Close()
		}
		time.Sleep(300 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("serve %s: %v", addr, err)
	}
	n := frames.Load()
	if n == 0 {
		t.Fatalf("serve on %s handled no frame", addr)
	}
	t.Logf("serve on %s handled %d frames", addr, n)
	_ = os.MkdirAll("/tmp/out", 0o755)
	_ = os.WriteFile("/tmp/out/frames", []byte(fmt.Sprint(n)), 0o644)
}
`

// outsideHostTest wraps README's RunGoTestT snippet into a host test.
const outsideHostTest = `package outside

import (
	"testing"

	"github.com/vfnic/vfnic/qemu"
)

func TestVM(t *testing.T) {
`

// TestVMOutsideModule: a module of its own (its go.mod requires vfnic
// through a replace to this checkout) builds a server from README's
// snippet and validates it in a guest, first with README's RunGoTestT
// snippet (go test -v: the guest's lines stream as they come), then with
// go test -exec vmexec; the setup check is vmsetup's, run from that
// module as README documents. One guest boot each.
func TestVMOutsideModule(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: only TestVMSmoke boots a guest")
	}
	RequireVM(t)
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	require.NoError(t, err)
	server, host := readmeSnippets(t, string(readme))

	dir := t.TempDir()
	write := func(name, text string) {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644))
	}
	write("go.mod", "module example.com/outside\n\ngo 1.26.3\n\nrequire github.com/vfnic/vfnic v0.0.0\n\nreplace github.com/vfnic/vfnic => "+root+"\n")
	write("myserver/main.go", outsideServer+server)
	write("myserver/server_test.go", outsideGuestTest)
	write("vm_test.go", outsideHostTest+host+"}\n")
	gocmd := func(env []string, args ...string) (string, error) {
		cmd := exec.CommandContext(t.Context(), goTool(), args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), env...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		start := time.Now()
		err := cmd.Run()
		t.Logf("go %s: %v", strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
		return out.String(), err
	}
	out, err := gocmd(nil, "mod", "tidy")
	require.NoError(t, err, out)
	out, err = gocmd(nil, "vet", "./...")
	require.NoError(t, err, "README's snippets, as written, vet clean:\n%s", out)

	// The documented setup, from this module: already done here.
	out, err = gocmd(nil, "run", "github.com/vfnic/vfnic/qemu/cmd/vmsetup", "-check")
	require.NoError(t, err, out)
	require.Contains(t, out, "ready: ")

	out, err = gocmd(nil, "test", "-count=1", "-v", "-run", "^TestVM$", ".")
	require.NoError(t, err, out)
	require.Contains(t, out, "--- PASS: TestVM/TestGuestServe")
	require.Regexp(t, `guest: .*serve on 0000:00:0[0-9a-f].0 handled [1-9]\d* frames`, out, "the guest's lines streamed under -v")
	t.Logf("RunGoTestT:\n%s", tail(out, 12))

	out, err = gocmd([]string{"CGO_ENABLED=0", "VFNIC_NICS=virtio,packed=on,net=hub:0 virtio,net=hub:0,ip=10.0.0.2/24",
		"VFNIC_HUGEPAGES=64", "VFNIC_TIMEOUT=3m"},
		"test", "-count=1", "-v", "-exec", "go run github.com/vfnic/vfnic/qemu/cmd/vmexec", "-run", "^TestGuestServe$", "./myserver")
	require.NoError(t, err, out)
	require.Contains(t, out, "--- PASS: TestGuestServe")
	require.Contains(t, out, "ok  \texample.com/outside/myserver")
	t.Logf("go test -exec vmexec:\n%s", tail(out, 8))
}

func tail(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}
