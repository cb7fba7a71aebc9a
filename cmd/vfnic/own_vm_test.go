package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/qemu"
)

// The ownership tests use two NICs of the guest's Linux on one wire
// (see TestVMTools): ownLinuxNIC keeps an address, ownTakenNIC is taken
// from Linux and given back.
const (
	ownLinuxNIC = "0000:00:06.0"
	ownTakenNIC = "0000:00:07.0"
	ownLinuxIP  = "10.0.0.2"
	ownTakenIP  = "10.0.0.3"
	ownEchoIP   = "10.0.0.1"
)

// helperEnv carries the arguments of a vfnic run in a child process.
const helperEnv = "VFNIC_CLI_HELPER_ARGS"

// TestMain runs vfnic instead of the tests in a child process of the
// test binary (startVfnic), so that another process holds a device. It
// exits before m.Run, where os.Exit(0) would count as a failure.
func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv(helperEnv); ok {
		os.Exit(run(strings.Split(args, "\x1f"), os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// vfnicProc is vfnic running in a child process.
type vfnicProc struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	buf  strings.Builder
	done chan error
	// ready closes when the output contains the word "(ready)".
	ready chan struct{}
}

func startVfnic(t *testing.T, args ...string) *vfnicProc {
	t.Helper()
	p := &vfnicProc{done: make(chan error, 1), ready: make(chan struct{})}
	p.cmd = exec.Command(os.Args[0], "-test.run=^$")
	p.cmd.Env = append(os.Environ(), helperEnv+"="+strings.Join(args, "\x1f"))
	pr, pw := io.Pipe()
	p.cmd.Stdout, p.cmd.Stderr = pw, pw
	require.NoError(t, p.cmd.Start())
	lines := make(chan string, 1024)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var outDone = make(chan struct{})
	go func() {
		defer close(outDone)
		readyOnce := false
		for l := range lines {
			p.mu.Lock()
			p.buf.WriteString(l + "\n")
			p.mu.Unlock()
			if !readyOnce && strings.Contains(l, "(ready)") {
				readyOnce = true
				close(p.ready)
			}
		}
	}()
	go func() {
		err := p.cmd.Wait()
		pw.Close()
		<-outDone
		p.done <- err
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
		}
	})
	return p
}

// output is what the process printed so far.
func (p *vfnicProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.buf.String()
}

func (p *vfnicProc) waitReady(t *testing.T) {
	t.Helper()
	select {
	case <-p.ready:
	case err := <-p.done:
		t.Fatalf("vfnic exited before it was ready (%v):\n%s", err, p.output())
	case <-time.After(30 * time.Second):
		t.Fatalf("vfnic not ready after 30 s")
	}
}

// wait returns the exit error and how long the process took to end.
func (p *vfnicProc) wait(limit time.Duration) (error, bool) {
	select {
	case err := <-p.done:
		return err, true
	case <-time.After(limit):
		return nil, false
	}
}

func driverOf(t *testing.T, addr string) string {
	t.Helper()
	l, err := os.Readlink("/sys/bus/pci/devices/" + addr + "/driver")
	if os.IsNotExist(err) {
		return ""
	}
	require.NoError(t, err)
	return filepath.Base(l)
}

// netIf waits for the kernel interface of a NIC on Linux: a virtio-net
// interface hangs below the virtio device, others below the PCI device.
func netIf(t *testing.T, addr string) string {
	t.Helper()
	for i := 0; i < 100; i++ {
		m, _ := filepath.Glob("/sys/bus/pci/devices/" + addr + "/virtio*/net/*")
		if len(m) == 0 {
			m, _ = filepath.Glob("/sys/bus/pci/devices/" + addr + "/net/*")
		}
		if len(m) == 1 {
			return filepath.Base(m[0])
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no network interface on %s", addr)
	return ""
}

func sh(t *testing.T, cmd string) string {
	t.Helper()
	out, err := exec.Command("sh", "-c", cmd).CombinedOutput()
	require.NoError(t, err, "%s:\n%s", cmd, out)
	return string(out)
}

func ping(t *testing.T, ifc, ip string) {
	t.Helper()
	out := sh(t, fmt.Sprintf("ping -c 3 -i 0.2 -W 3 -I %s %s", ifc, ip))
	require.Contains(t, out, "3 packets received", out)
}

// TestGuestCLIOwnership takes devices from the guest's Linux and gives
// them back, and checks that nothing that would hang or strand a device
// goes through.
func TestGuestCLIOwnership(t *testing.T) {
	if !qemu.InGuest() {
		t.Skip("needs VFIO: runs inside the guest booted by TestVMTools")
	}
	require.Equal(t, "virtio-pci", driverOf(t, ownLinuxNIC))
	require.Equal(t, "virtio-pci", driverOf(t, ownTakenNIC))
	sh(t, "ip link set "+netIf(t, ownTakenNIC)+" down")

	t.Run("DoctorAndListJSON", func(t *testing.T) {
		code, out, errw := runCLI("doctor", "-json", ownTakenNIC)
		require.Zero(t, code, "a guest with a vIOMMU, vfio-pci and hugepages is ready: %s\n%s", errw, out)
		var r struct {
			Ready  bool `json:"ready"`
			Checks []struct{ Name, Status string }
		}
		require.NoError(t, json.Unmarshal([]byte(out), &r))
		require.True(t, r.Ready)
		require.NotEmpty(t, r.Checks)

		code, out, errw = runCLI("list", "-json")
		require.Zero(t, code, errw)
		var lo listOutput
		require.NoError(t, json.Unmarshal([]byte(out), &lo))
		require.True(t, lo.VFIOReady, "warnings: %v", lo.Warnings)
		var linux *listedDevice
		for i := range lo.Devices {
			if lo.Devices[i].Address == ownLinuxNIC {
				linux = &lo.Devices[i]
			}
		}
		require.NotNil(t, linux, out)
		require.Equal(t, "virtio-pci", linux.Driver)
		require.Contains(t, linux.Active, "interface "+linux.Interfaces[0]+" has address "+ownLinuxIP+"/24")
	})

	t.Run("UnbindRefusesLinuxDriver", func(t *testing.T) {
		code, out, errw := runCLI("unbind", ownLinuxNIC)
		require.Equal(t, 1, code, out)
		require.Contains(t, errw, ownLinuxNIC+" is bound to virtio-pci")
		require.Contains(t, errw, "-force")
		require.Equal(t, "virtio-pci", driverOf(t, ownLinuxNIC), "left on its driver")
		// -force still refuses a NIC the kernel uses.
		code, _, errw = runCLI("unbind", "-force", ownLinuxNIC)
		require.Equal(t, 1, code)
		require.Contains(t, errw, "has address "+ownLinuxIP+"/24")
		require.Equal(t, "virtio-pci", driverOf(t, ownLinuxNIC))

		// Every command that would take it says how, as bind does.
		for _, args := range [][]string{
			{"sink", "-duration", "1s", ownLinuxNIC},
			{"capture", "-c", "1", ownLinuxNIC, "icmp"},
			{"pktgen", "-count", "1", ownLinuxNIC},
			{"echo", "-ip", ownEchoIP, ownLinuxNIC},
			{"info", ownLinuxNIC},
		} {
			code, _, errw = runCLI(args...)
			require.Equal(t, 1, code, "%v: %s", args, errw)
			require.Contains(t, errw, "has address "+ownLinuxIP+"/24", args)
			require.Contains(t, errw, "(use -force to take it anyway)", args)
		}
		code, _, errw = runCLI("probe", ownLinuxNIC)
		require.Equal(t, 1, code)
		require.Contains(t, errw, "run 'vfnic bind -force "+ownLinuxNIC+"' to take it anyway")
		require.Equal(t, "virtio-pci", driverOf(t, ownLinuxNIC))
		// With -force: a warning of what the kernel loses; info binds it for
		// the look and gives it back, and vfnic gives the interface made
		// again its MTU, state, address and route back.
		ifc := netIf(t, ownLinuxNIC)
		sh(t, "ip link set dev "+ifc+" mtu 1400")
		defer exec.Command("sh", "-c", "ip link set dev "+netIf(t, ownLinuxNIC)+" mtu 1500").Run()
		sh(t, "ip route add 10.9.0.0/16 via 10.0.0.1 dev "+ifc)
		defer exec.Command("sh", "-c", "ip route del 10.9.0.0/16").Run()
		code, out, errw = runCLI("info", "-force", ownLinuxNIC)
		require.Zero(t, code, errw)
		t.Log(errw)
		require.Contains(t, errw, "warning: -force takes "+ownLinuxNIC+" from virtio-pci although ")
		require.Contains(t, errw, "has address "+ownLinuxIP+"/24")
		require.Contains(t, out, "binding          bound to vfio-pci for this look (was virtio-pci), given back on exit")
		require.Equal(t, "virtio-pci", driverOf(t, ownLinuxNIC))
		ifc = netIf(t, ownLinuxNIC)
		require.Contains(t, errw, "gave "+ownLinuxNIC+"'s interfaces back what they had: "+ifc+": mtu 1400, up, "+ownLinuxIP+"/24, route to 10.9.0.0/16 via 10.0.0.1")
		require.NotContains(t, errw, "refused")
		require.Contains(t, sh(t, "ip addr show dev "+ifc), "inet "+ownLinuxIP+"/24")
		require.Regexp(t, `<[^>]*\bUP\b.* mtu 1400 `, sh(t, "ip link show dev "+ifc))
		require.Contains(t, sh(t, "ip route show"), "10.9.0.0/16 via 10.0.0.1 dev "+ifc)
	})

	t.Run("UsageBeforeBinding", func(t *testing.T) {
		// A frame longer than the NIC takes (no MTU offered: 1500) is
		// refused before the NIC is taken from its kernel driver.
		sh(t, "ip link set "+netIf(t, ownTakenNIC)+" down")
		code, out, errw := runCLI("pktgen", "-size", "20000", ownTakenNIC)
		require.Equal(t, exitUsage, code, errw)
		require.Contains(t, errw, "-size 20000: longer than any frame "+ownTakenNIC+" takes")
		require.NotContains(t, out+errw, "bound "+ownTakenNIC)
		require.Equal(t, "virtio-pci", driverOf(t, ownTakenNIC), "never bound")
	})

	t.Run("OpenCloseGivesBack", func(t *testing.T) {
		dev, err := nic.Open(t.Context(), ownTakenNIC, nic.Config{})
		require.NoError(t, err)
		in := dev.Info()
		require.True(t, in.Rebound)
		require.Equal(t, "virtio-pci", in.PreviousDriver)
		require.Equal(t, "vfio-pci", driverOf(t, ownTakenNIC))
		require.NoError(t, dev.Close())
		require.Equal(t, "virtio-pci", driverOf(t, ownTakenNIC), "Close gave it back")
		ov, err := os.ReadFile("/sys/bus/pci/devices/" + ownTakenNIC + "/driver_override")
		require.NoError(t, err)
		require.Equal(t, "(null)", strings.TrimSpace(string(ov)))

		dev, err = nic.Open(t.Context(), ownTakenNIC, nic.Config{KeepBound: true})
		require.NoError(t, err)
		require.NoError(t, dev.Close())
		require.Equal(t, "vfio-pci", driverOf(t, ownTakenNIC), "KeepBound")
		code, out, errw := runCLI("unbind", ownTakenNIC)
		require.Zero(t, code, errw)
		require.Contains(t, out, "unbound "+ownTakenNIC+" from vfio-pci, now virtio-pci")
	})

	t.Run("FailedOpenLeavesItWhereItWas", func(t *testing.T) {
		sh(t, "ip link set "+netIf(t, ownTakenNIC)+" down")
		_, err := nic.Open(t.Context(), ownTakenNIC, nic.Config{QueuePairs: 8})
		require.ErrorIs(t, err, nic.ErrNotSupported, "the NIC offers one queue pair")
		require.Equal(t, "virtio-pci", driverOf(t, ownTakenNIC))
	})

	t.Run("KernelUnbindCancels", func(t *testing.T) {
		sh(t, "ip link set "+netIf(t, ownTakenNIC)+" down")
		dev, err := nic.Open(t.Context(), ownTakenNIC, nic.Config{QueueSize: 64, RxBuffers: 64})
		require.NoError(t, err)
		defer dev.Close()
		rx, err := dev.Rx(0)
		require.NoError(t, err)
		posted := 0
		for rx.PostRecv(posted) == nil {
			posted++
		}
		require.NoError(t, rx.Flush())
		unbound := make(chan error, 1)
		go func() {
			unbound <- os.WriteFile("/sys/bus/pci/devices/"+ownTakenNIC+"/driver/unbind", []byte(ownTakenNIC), 0o200)
		}()
		comps := make([]nic.Completion, 16)
		canceled, frames := 0, 0
		var end error
		for end == nil {
			n, err := rx.SRead(t.Context(), comps, 1, 5*time.Second)
			for _, c := range comps[:n] {
				if c.Err != nil {
					require.ErrorIs(t, c.Err, nic.ErrCanceled)
					canceled++
				} else {
					frames++ // stray traffic on the wire before the removal
				}
			}
			end = err
		}
		require.ErrorIs(t, end, nic.ErrRemoved)
		require.ErrorIs(t, end, nic.ErrClosed)
		require.Equal(t, posted-frames, canceled, "every outstanding receive reported canceled")
		require.NoError(t, <-unbound)
		require.NoError(t, dev.Close())
		require.Equal(t, "virtio-pci", driverOf(t, ownTakenNIC), "given back after the kernel's unbind")
		t.Logf("%d receives posted, %d canceled by the removal, %d frames before it", posted, canceled, frames)
	})

	t.Run("HeldAndKernelUnbind", func(t *testing.T) {
		linuxIf := netIf(t, ownLinuxNIC)
		sh(t, "ip link set "+netIf(t, ownTakenNIC)+" down")
		echo := startVfnic(t, "echo", "-ip", ownEchoIP, "-progress", "0", ownTakenNIC)
		echo.waitReady(t)
		require.Contains(t, echo.output(), "bound "+ownTakenNIC+" to vfio-pci (was virtio-pci)")
		ping(t, linuxIf, ownEchoIP)

		// Another process holds it: refused at once, naming the holder.
		start := time.Now()
		code, _, errw := runCLI("unbind", ownTakenNIC)
		took := time.Since(start)
		t.Logf("unbind of a held device: exit %d after %v: %s", code, took, errw)
		require.Equal(t, 1, code)
		require.Less(t, took, 2*time.Second)
		require.Contains(t, errw, fmt.Sprintf("pid %d", echo.cmd.Process.Pid))
		require.Equal(t, "vfio-pci", driverOf(t, ownTakenNIC), "still bound")
		// Every command that would open it names the holder too.
		for _, args := range [][]string{
			{"sink", "-duration", "1s", ownTakenNIC},
			{"capture", "-c", "1", "-w", "/dev/null", ownTakenNIC},
			{"info", "-json", ownTakenNIC},
			{"probe", ownTakenNIC},
		} {
			code, _, errw = runCLI(args...)
			t.Logf("%v: %s", args, errw)
			require.Equal(t, 1, code, "%v: %s", args, errw)
			require.Contains(t, errw, fmt.Sprintf("in use by pid %d", echo.cmd.Process.Pid), args)
		}
		ping(t, linuxIf, ownEchoIP) // and still working

		// The kernel's own unbind asks vfnic to let go.
		start = time.Now()
		unbound := make(chan error, 1)
		go func() {
			unbound <- os.WriteFile("/sys/bus/pci/devices/"+ownTakenNIC+"/driver/unbind", []byte(ownTakenNIC), 0o200)
		}()
		err, ended := echo.wait(5 * time.Second)
		took = time.Since(start)
		require.True(t, ended, "echo still running 5 s after the kernel unbind:\n%s", echo.output())
		t.Logf("echo ended %v after the sysfs unbind:\n%s", took, echo.output())
		require.NoError(t, err, "echo exits cleanly")
		require.Contains(t, echo.output(), "echo: completions rx", "with its summary")
		require.Contains(t, echo.output(), "the kernel took "+ownTakenNIC+" back")
		select {
		case err := <-unbound:
			require.NoError(t, err)
		case <-time.After(5 * time.Second):
			t.Fatal("the sysfs unbind still blocks")
		}
		require.Equal(t, "virtio-pci", driverOf(t, ownTakenNIC), "back on its original driver")

		// Usable by Linux: its interface pings vfnic echo on the other NIC,
		// across the wire.
		sh(t, "ip addr flush dev "+linuxIf+" && ip link set "+linuxIf+" down")
		takenIf := netIf(t, ownTakenNIC)
		sh(t, fmt.Sprintf("ip link set %s up && ip addr add %s/24 dev %s", takenIf, ownTakenIP, takenIf))
		echo2 := startVfnic(t, "echo", "-ip", ownEchoIP, "-progress", "0", ownLinuxNIC)
		echo2.waitReady(t)
		ping(t, takenIf, ownEchoIP)
		require.NoError(t, echo2.cmd.Process.Signal(syscall.SIGINT))
		err, ended = echo2.wait(10 * time.Second)
		require.True(t, ended)
		require.NoError(t, err, echo2.output())
		require.Equal(t, "virtio-pci", driverOf(t, ownLinuxNIC), "echo gave it back on exit")
		sh(t, fmt.Sprintf("ip link set %s up && ip addr add %s/24 dev %s", netIf(t, ownLinuxNIC), ownLinuxIP, netIf(t, ownLinuxNIC)))
	})
}
