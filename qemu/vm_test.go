package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// logConsoleOnFailure logs the guest console if the test failed.
func logConsoleOnFailure(t *testing.T, res **Result) {
	t.Cleanup(func() {
		if t.Failed() && *res != nil {
			t.Logf("guest console:\n%s", (*res).Console)
		}
	})
}

// TestVMSmoke boots a guest with a packed virtio-net NIC and an e1000e NIC,
// both bound to vfio-pci, and runs testdata/pcidump in it.
func TestVMSmoke(t *testing.T) {
	RequireVM(t)
	bin := filepath.Join(t.TempDir(), "pcidump")
	buildStart := time.Now()
	require.NoError(t, BuildBinary(t.Context(), "./testdata/pcidump", bin))
	build := time.Since(buildStart)

	k, err := FindKernel()
	require.NoError(t, err)
	var res *Result
	logConsoleOnFailure(t, &res)
	cfg := Config{
		NICs:    []NIC{{Model: VirtioNet, Packed: true}, {Model: E1000E}},
		Timeout: time.Minute,
	}
	res, err = Run(t.Context(), cfg, Command{Path: bin})
	require.NoError(t, err)
	t.Logf("build %v, boot to /init %v, whole run %v", build.Round(time.Millisecond), res.Boot.Round(time.Millisecond), res.Duration.Round(time.Millisecond))
	t.Logf("payload output:\n%s", res.Output)

	require.Equal(t, 0, res.ExitCode)
	require.Equal(t, k.Version, res.KernelVersion)
	require.NotContains(t, res.Output, "VFNIC-", "markers stay out of the payload output")
	require.Contains(t, res.Console, "VFNIC-EXIT: 0")
	groups := map[string]bool{}
	for _, want := range []struct{ addr, id string }{{"0000:00:04.0", "1af4:1041"}, {"0000:00:05.0", "8086:10d3"}} {
		m := regexp.MustCompile(`PCI ` + regexp.QuoteMeta(want.addr) + ` ` + want.id + ` driver=vfio-pci group=(\d+)`).FindStringSubmatch(res.Output)
		require.NotNil(t, m, "%s (%s) on vfio-pci with an IOMMU group", want.addr, want.id)
		require.False(t, groups[m[1]], "each NIC alone in its IOMMU group")
		groups[m[1]] = true
		require.Contains(t, res.Output, fmt.Sprintf("vfio-pci /dev/vfio/%s ok", m[1]))
		require.Contains(t, res.Bound, fmt.Sprintf("VFNIC-VFIO: %s group %s", want.addr, m[1]))
	}
	require.Contains(t, res.Output, "pcidump: all NICs ok")
	require.Less(t, res.Duration, 50*time.Second)
}

// TestVMGoTest runs testdata/guesttest in a guest and checks that pass,
// fail, skip and subtests all reach the host.
func TestVMGoTest(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: only TestVMSmoke boots a guest")
	}
	RequireVM(t)
	cfg := Config{NICs: []NIC{{Model: VirtioNet}, {Model: E1000E}}, Hugepages: -1, Timeout: time.Minute}
	rep, err := RunGoTest(t.Context(), cfg, GoTest{Package: "./testdata/guesttest", Env: []string{"VFNIC_WANT_FAIL=1"}})
	require.ErrorIs(t, err, ErrTestsFailed)
	require.NotNil(t, rep)
	got := map[string]TestStatus{}
	for _, r := range rep.Tests {
		got[r.Name] = r.Status
	}
	require.Equal(t, map[string]TestStatus{
		"TestGuestPass": TestPass, "TestGuestPass/virtio-net-pci": TestPass, "TestGuestPass/e1000e": TestPass,
		"TestGuestFail": TestFail, "TestGuestSkip": TestSkip,
	}, got, "guest output:\n%s", rep.Result.Output)
	require.Equal(t, 1, rep.Result.ExitCode)
	t.Logf("guest tests: %v (run %v)", got, rep.Result.Duration.Round(time.Millisecond))
}

// TestVMFailures checks that each way a run can fail is reported as such.
func TestVMFailures(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: only TestVMSmoke boots a guest")
	}
	RequireVM(t)
	t.Run("timeout during boot", func(t *testing.T) {
		res, err := Run(t.Context(), Config{Timeout: 300 * time.Millisecond}, Command{GuestPath: "/bin/true"})
		require.ErrorIs(t, err, ErrTimeout)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Contains(t, err.Error(), "while the kernel booted")
		require.Equal(t, -1, res.ExitCode)
	})
	t.Run("boot timeout", func(t *testing.T) {
		// A kernel not at /init by BootTimeout is killed as hung, long
		// before Timeout.
		start := time.Now()
		res, err := Run(t.Context(), Config{BootTimeout: 300 * time.Millisecond}, Command{GuestPath: "/bin/true"})
		require.ErrorIs(t, err, ErrBootFailed)
		require.False(t, errors.Is(err, ErrTimeout), "%v", err)
		require.Contains(t, err.Error(), "did not reach /init within 300ms")
		require.Empty(t, res.Signal, "QEMU was killed by Run, not crashed")
		require.Less(t, time.Since(start), DefaultTimeout/2)
	})
	t.Run("setup fails", func(t *testing.T) {
		// More hugepages than the guest can hold: /init stops before the payload.
		res, err := Run(t.Context(), Config{MemoryMB: 256, Hugepages: 120}, Command{GuestPath: "/bin/true"})
		require.ErrorIs(t, err, ErrPayloadNotStarted)
		require.Contains(t, err.Error(), "hugepages")
		require.NotEmpty(t, res.KernelVersion)
	})
	t.Run("payload exits non-zero", func(t *testing.T) {
		var live bytes.Buffer
		// What a failing payload wrote still comes back: that is when it matters.
		back := filepath.Join(t.TempDir(), "why.txt")
		res, err := Run(t.Context(), Config{Hugepages: -1, Output: &live, Collect: []Collect{{Guest: "/tmp/out/why.txt", Host: back}}},
			Command{GuestPath: "/bin/sh", Args: []string{"-c", `echo "out $VFNIC_GUEST"; echo err >&2; echo because > /tmp/out/why.txt; exit 7`}})
		require.ErrorIs(t, err, ErrPayloadFailed)
		require.False(t, errors.Is(err, ErrCollect), "%v", err)
		require.Equal(t, 7, res.ExitCode)
		require.Equal(t, "out 1\nerr\n", res.Output)
		require.Equal(t, res.Output, live.String())
		b, err := os.ReadFile(back)
		require.NoError(t, err)
		require.Equal(t, "because\n", string(b))
		require.Equal(t, []string{back}, res.Collected)
	})
	t.Run("canceled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(500*time.Millisecond, cancel)
		start := time.Now()
		_, err := Run(ctx, Config{}, Command{GuestPath: "/bin/sleep", Args: []string{"100"}})
		require.ErrorIs(t, err, context.Canceled)
		require.False(t, errors.Is(err, ErrTimeout))
		require.Less(t, time.Since(start), 10*time.Second, "QEMU killed promptly")
	})
}

// TestVMExec runs testdata/guesttest through `go test -exec vmexec`.
func TestVMExec(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: only TestVMSmoke boots a guest")
	}
	RequireVM(t)
	vmexec := filepath.Join(t.TempDir(), "vmexec")
	out, err := exec.CommandContext(t.Context(), "go", "build", "-o", vmexec, "./cmd/vmexec").CombinedOutput()
	require.NoError(t, err, "%s", out)
	// Coverage of package qemu as the guest test exercises it, and a CPU
	// profile (relative: go test puts it in -outputdir), come back from the guest.
	outDir := t.TempDir()
	cover := filepath.Join(outDir, "cover.out")
	cmd := exec.CommandContext(t.Context(), "go", "test", "-count=1", "-v", "-exec", vmexec, "-run", "TestGuestPass",
		"-coverpkg=github.com/vfnic/vfnic/qemu", "-coverprofile="+cover, "-cpuprofile=cpu.out", "-outputdir="+outDir,
		"-o", filepath.Join(outDir, "guesttest.test"), "./testdata/guesttest")
	// VFNIC_TIMEOUT bounds each guest well inside this test's own time: a
	// guest left to vmexec's default (-test.timeout + 1m) outlived a host
	// test that timed out, leaving go test, vmexec and QEMU behind.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "VFNIC_NICS=virtio,packed=on;igb", "VFNIC_HUGEPAGES=-1", "VFNIC_TIMEOUT=3m")
	start := time.Now()
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "go test -exec vmexec:\n%s", out)
	s := string(out)
	require.Contains(t, s, "--- PASS: TestGuestPass/virtio-net-pci")
	require.Contains(t, s, "--- PASS: TestGuestPass/igb")
	require.True(t, strings.Contains(s, "ok  \tgithub.com/vfnic/vfnic/qemu/testdata/guesttest"), s)
	t.Logf("go test -exec vmexec: %v", time.Since(start).Round(time.Millisecond))
	require.Regexp(t, `coverage: [0-9.]+% of statements in github.com/vfnic/vfnic/qemu`, s)
	prof, err := os.ReadFile(cover)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(prof), "mode: "), "%.200s", prof)
	// GuestNICs ran in the guest: some block of guest.go has a count.
	require.Regexp(t, `(?m)^github.com/vfnic/vfnic/qemu/guest.go:[0-9.,]+ [0-9]+ [1-9][0-9]*$`, string(prof))
	cpu, err := os.ReadFile(filepath.Join(outDir, "cpu.out"))
	require.NoError(t, err)
	require.True(t, len(cpu) > 2 && cpu[0] == 0x1f && cpu[1] == 0x8b, "cpu.out is a gzipped pprof profile (%d bytes)", len(cpu))

	// The guest's exit status comes back as vmexec's.
	cmd = exec.CommandContext(t.Context(), "go", "test", "-count=1", "-exec", vmexec, "-run", "TestGuestFail", "./testdata/guesttest")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "VFNIC_NICS=e1000e", "VFNIC_HUGEPAGES=-1", "VFNIC_TIMEOUT=3m",
		"VFNIC_GUEST_ENV=VFNIC_WANT_FAIL=1")
	out, err = cmd.CombinedOutput()
	require.Error(t, err, "%s", out)
	require.Contains(t, string(out), "--- FAIL: TestGuestFail")
}

// TestVMDgramLinuxNIC gives a virtio-net NIC to the guest's Linux on a
// dgram backend and checks that its frames reach a host UDP socket (and,
// in the same guest, that a vmxnet3 NIC binds to vfio-pci).
func TestVMDgramLinuxNIC(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: only TestVMSmoke boots a guest")
	}
	RequireVM(t)
	nd, err := NewDgram()
	require.NoError(t, err)
	host, err := net.ListenPacket("udp4", fmt.Sprintf("127.0.0.1:%d", nd.HostPort))
	require.NoError(t, err)
	defer host.Close()
	frames := make(chan []byte, 64)
	go func() {
		buf := make([]byte, 2048)
		for {
			n, _, err := host.ReadFrom(buf)
			if err != nil {
				close(frames)
				return
			}
			frames <- bytes.Clone(buf[:n])
		}
	}()

	var res *Result
	logConsoleOnFailure(t, &res)
	cfg := Config{
		NICs: []NIC{
			{Model: VirtioNet, Packed: true, Bind: BindLinux, IPv4: "10.9.0.2/24", MAC: "02:00:00:00:09:02", Net: nd},
			{Model: VMXNET3},
		},
		Hugepages: -1,
		Timeout:   time.Minute,
	}
	// ARP for a host that does not answer: each request is one frame out.
	res, err = Run(t.Context(), cfg, Command{GuestPath: "/bin/sh", Args: []string{"-c", "ping -c 2 -W 1 10.9.0.1; ls /dev/vfio; true"}})
	require.NoError(t, err)
	require.Contains(t, res.Bound, "VFNIC-NET: 0000:00:04.0 eth0 10.9.0.2/24")
	require.Contains(t, strings.Join(res.Bound, "\n"), "VFNIC-VFIO: 0000:00:05.0 group")

	mac := []byte{0x02, 0, 0, 0, 0x09, 0x02}
	timeout := time.After(5 * time.Second)
	for {
		select {
		case f, ok := <-frames:
			require.True(t, ok, "host socket closed")
			// Ethernet: dst[6] src[6] type[2]; ARP request for 10.9.0.1.
			if len(f) >= 42 && bytes.Equal(f[6:12], mac) && f[12] == 0x08 && f[13] == 0x06 &&
				bytes.Equal(f[38:42], []byte{10, 9, 0, 1}) {
				t.Logf("ARP request from the guest reached the host: % x", f[:42])
				return
			}
		case <-timeout:
			t.Fatal("no ARP frame from the guest's NIC reached the host socket")
		}
	}
}

// TestVMRunGoTestT reports guest tests as subtests of this test.
func TestVMRunGoTestT(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: only TestVMSmoke boots a guest")
	}
	rep := RunGoTestT(t, Config{NICs: []NIC{{Model: IGB}}, Hugepages: -1}, GoTest{Package: "./testdata/guesttest"})
	require.NotNil(t, rep)
	// TestGuestPass, its igb subtest, and TestGuestFail and TestGuestSkip,
	// which fail or skip only when asked to.
	require.Equal(t, 4, rep.Count(TestPass))
	require.Zero(t, rep.Count(TestFail)+rep.Count(TestSkip))
	require.NoError(t, rep.Err)
}

// TestVMNICPropsCollect gives two virtio-net NICs to the guest's Linux, one
// with device properties and one without, and checks what the guest saw
// (MTU, negotiated features, ring sizes) in a file brought back from the
// guest, along with a 6 MiB file and a directory tree; a Collect path the
// guest never wrote fails the run with ErrCollect and names it.
func TestVMNICPropsCollect(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: only TestVMSmoke boots a guest")
	}
	RequireVM(t)
	bin := filepath.Join(t.TempDir(), "nicprops")
	require.NoError(t, BuildBinary(t.Context(), "./testdata/nicprops", bin))
	nics, err := ParseNICs("virtio,bind=linux,mac=02:00:00:00:00:10,host_mtu=9000,rx_queue_size=1024,event_idx=off,mrg_rxbuf=off;" +
		"virtio,bind=linux,mac=02:00:00:00:00:11")
	require.NoError(t, err)
	host := t.TempDir()
	var res *Result
	logConsoleOnFailure(t, &res)
	cfg := Config{
		NICs:      nics,
		Hugepages: -1,
		Timeout:   2 * time.Minute,
		Collect: []Collect{
			{Guest: "/vfnic/out", Host: filepath.Join(host, "out"), Dir: true},
			{Guest: "/vfnic/never-written.pcap", Host: filepath.Join(host, "never.pcap")},
		},
	}
	res, err = Run(t.Context(), cfg, Command{Path: bin, Args: []string{"-out", "/vfnic/out"}})
	require.ErrorIs(t, err, ErrCollect)
	require.ErrorContains(t, err, "the guest has no /vfnic/never-written.pcap")
	require.Equal(t, 0, res.ExitCode, "output: %s", res.Output)
	t.Logf("run %v (boot %v), brought back %v", res.Duration.Round(time.Millisecond), res.Boot.Round(time.Millisecond), res.Collected)

	b, err := os.ReadFile(filepath.Join(host, "out", "props.json"))
	require.NoError(t, err)
	var got []map[string]any
	require.NoError(t, json.Unmarshal(b, &got))
	t.Logf("guest saw: %s", b)
	byMAC := map[string]map[string]any{}
	for _, n := range got {
		byMAC[n["mac"].(string)] = n
	}
	tuned, plain := byMAC["02:00:00:00:00:10"], byMAC["02:00:00:00:00:11"]
	require.NotNil(t, tuned, "%s", b)
	require.NotNil(t, plain, "%s", b)
	require.Equal(t, map[string]any{"mtu": 9000.0, "event_idx": false, "mrg_rxbuf": false, "feat_mtu": true, "rx_ring_max": 1024.0},
		pick(tuned, "mtu", "event_idx", "mrg_rxbuf", "feat_mtu", "rx_ring_max"))
	require.Equal(t, map[string]any{"mtu": 1500.0, "event_idx": true, "mrg_rxbuf": true, "feat_mtu": false, "rx_ring_max": 256.0},
		pick(plain, "mtu", "event_idx", "mrg_rxbuf", "feat_mtu", "rx_ring_max"))

	blob, err := os.ReadFile(filepath.Join(host, "out", "blob.bin"))
	require.NoError(t, err)
	require.True(t, bytes.Equal(testBlob(6<<20), blob), "6 MiB file came back byte-identical (got %d bytes)", len(blob))
	note, err := os.ReadFile(filepath.Join(host, "out", "tree", "sub", "note.txt"))
	require.NoError(t, err)
	require.Equal(t, "from the guest\n", string(note))
	require.NoFileExists(t, filepath.Join(host, "never.pcap"))
}

func pick(m map[string]any, keys ...string) map[string]any {
	out := map[string]any{}
	for _, k := range keys {
		out[k] = m[k]
	}
	return out
}

// testBlob is testdata/nicprops's Blob.
func testBlob(n int) []byte {
	r := rand.New(rand.NewPCG(7, 9))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}
