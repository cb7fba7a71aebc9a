package qemu

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/qemu/initramfs"
)

func TestNICArgsPerModel(t *testing.T) {
	nics, err := ResolveNICs([]NIC{
		{Model: VirtioNet, Packed: true, Net: Dgram(40000, 40001)},
		{Model: VirtioNet, Net: Hub(3)},
		{Model: E1000E, Net: Hub(3), Bind: BindLinux, IPv4: "10.0.0.2/24"},
		{Model: IGB, Slot: 0x04 + 10, MAC: "02:00:00:00:00:01"},
		{Model: VMXNET3, Bind: BindNone},
	})
	require.NoError(t, err)
	var got []string
	for i, n := range nics {
		got = append(got, strings.Join(n.qemuArgs(i), " "))
	}
	want := []string{
		"-netdev dgram,id=n0,local.type=inet,local.host=127.0.0.1,local.port=40000,remote.type=inet,remote.host=127.0.0.1,remote.port=40001 " +
			"-device virtio-net-pci,id=nic0,bus=pcie.0,addr=0x04,mac=52:54:00:12:34:04,netdev=n0,disable-legacy=on,iommu_platform=on,packed=on,ats=on",
		"-netdev hubport,id=n1,hubid=3 -device virtio-net-pci,id=nic1,bus=pcie.0,addr=0x05,mac=52:54:00:12:34:05,netdev=n1,disable-legacy=on,iommu_platform=on,packed=off,ats=on",
		"-netdev hubport,id=n2,hubid=3 -device e1000e,id=nic2,bus=pcie.0,addr=0x06,mac=52:54:00:12:34:06,netdev=n2",
		"-device igb,id=nic3,bus=pcie.0,addr=0x0e,mac=02:00:00:00:00:01",
		"-device vmxnet3,id=nic4,bus=pcie.0,addr=0x07,mac=52:54:00:12:34:07",
	}
	require.Equal(t, want, got)
	require.Equal(t, "0000:00:0e.0", nics[3].GuestAddr())
	require.Equal(t, BindVFIO, nics[0].Bind, "default binding")
}

func TestResolveNICsErrors(t *testing.T) {
	bad := [][]NIC{
		{{Model: E1000E, Packed: true}},
		{{Model: E1000E, Slot: 0x1f}},
		{{Model: E1000E, Slot: 5}, {Model: IGB, Slot: 5}},
		{{Model: E1000E, MAC: "zz"}},
		{{Model: E1000E, IPv4: "10.0.0.1/24"}},                 // IP on a vfio NIC
		{{Model: E1000E, Bind: BindLinux, IPv4: "10.0.0.1"}},   // no prefix
		{{Model: E1000E, Bind: BindLinux, IPv4: "fe80::1/64"}}, // not IPv4
		{{Model: E1000E, Net: Dgram(0, 5)}},                    // bad port
		{{Model: E1000E, Net: Dgram(5, 5)}},                    // same port
		{{Model: "e1000e,romfile=x"}},                          // option injection
		{{Model: E1000E, Bind: "kernel"}},                      // unknown binding
		{{Model: E1000E, Net: Netdev{Kind: "tap"}}},            // tap without a wire
		{{Model: E1000E, Net: Tap("br-0")}},                    // a wire name ip would misread
		{{Model: E1000E, Net: Netdev{Kind: "vde"}}},            // unknown backend
	}
	for i, nics := range bad {
		_, err := ResolveNICs(nics)
		require.ErrorIs(t, err, ErrBadConfig, "case %d", i)
	}
	var many []NIC
	for range 30 {
		many = append(many, NIC{Model: E1000E})
	}
	_, err := ResolveNICs(many)
	require.ErrorIs(t, err, ErrBadConfig)
	// Automatic slots skip explicit ones.
	nics, err := ResolveNICs([]NIC{{Model: E1000E}, {Model: E1000E, Slot: 5}, {Model: E1000E}})
	require.NoError(t, err)
	require.Equal(t, []int{4, 5, 6}, []int{nics[0].Slot, nics[1].Slot, nics[2].Slot})
}

func TestParseFormatNICs(t *testing.T) {
	nics, err := ParseNICs("virtio,packed=on,net=hub:0 e1000e,net=dgram:4000:4001;igb,ip=10.1.0.2/16,slot=0x10,mac=02:00:00:00:00:09")
	require.NoError(t, err)
	require.Equal(t, []NIC{
		{Model: VirtioNet, Packed: true, Net: Hub(0)},
		{Model: E1000E, Net: Dgram(4000, 4001)},
		{Model: IGB, Bind: BindLinux, IPv4: "10.1.0.2/16", Slot: 0x10, MAC: "02:00:00:00:00:09"},
	}, nics)
	resolved, err := ResolveNICs(nics)
	require.NoError(t, err)
	back, err := ParseNICs(FormatNICs(resolved))
	require.NoError(t, err)
	require.Equal(t, resolved, back)
	for _, s := range []string{"virtio,packed=maybe", "e1000e,slot=x", "e1000e,net=udp", "e1000e,novalue",
		"e1000e,addr=5", "virtio,iommu_platform=off", "e1000e,x=1,x=2", "e1000e,bad!name=1", "e1000e,x="} {
		_, err := ParseNICs(s)
		require.ErrorIs(t, err, ErrBadConfig, s)
	}
	// A NIC without a model is refused (FormatNICs wrote it as nothing,
	// and the round trip lost it), and so is what ResolveNICs refuses:
	// FormatNICs dropped a packed=on of a model with no packed ring.
	for s, msg := range map[string]string{
		",net=":                         "no model",
		",":                             "no model",
		"net=hub:0":                     "no model",
		"virtio ,mac=02:00:00:00:00:01": "no model",
		"e1000e,packed=on":              "packed rings are a virtio-net option",
		"igb,slot=4 e1000e,slot=4":      "both on slot 0x4",
		"igb,slot=0x20":                 "slot 0x20 outside",
		"igb,mac=xx":                    `MAC "xx"`,
		"igb,net=hub:-1":                "hub id -1",
		"igb,net=dgram:5:5":             "both 5",
		"igb,bind=vfio,ip=10.0.0.1/24":  "IPv4",
		"igb,bind=kernel":               `binding "kernel"`,
		"igb,net=tap:":                  `tap wire ""`,
		"igb,net=tap:a-b":               `tap wire "a-b"`,
		"igb,net=tap:abcdefghijklm":     `tap wire "abcdefghijklm"`,
		"igb,net=tap:a:b":               `net="tap:a:b"`,
	} {
		_, err := ParseNICs(s)
		require.ErrorIs(t, err, ErrBadConfig, s)
		require.ErrorContains(t, err, msg, s)
	}
	empty, err := ParseNICs("  ")
	require.NoError(t, err)
	require.Empty(t, empty)
}

func TestNICProps(t *testing.T) {
	nics, err := ParseNICs("virtio,event_idx=off,mrg_rxbuf=off,rx_queue_size=1024,host_mtu=9000,net=hub:1 e1000e,ats=off")
	require.NoError(t, err)
	want := map[string]string{"event_idx": "off", "mrg_rxbuf": "off", "rx_queue_size": "1024", "host_mtu": "9000"}
	require.Equal(t, want, nics[0].Props)
	require.Equal(t, Hub(1), nics[0].Net)
	resolved, err := ResolveNICs(nics)
	require.NoError(t, err)
	require.Equal(t, []string{"-netdev", "hubport,id=n0,hubid=1", "-device",
		"virtio-net-pci,id=nic0,bus=pcie.0,addr=0x04,mac=52:54:00:12:34:04,netdev=n0,disable-legacy=on,iommu_platform=on,packed=off,ats=on," +
			"event_idx=off,host_mtu=9000,mrg_rxbuf=off,rx_queue_size=1024"}, resolved[0].qemuArgs(0))
	require.Equal(t, []string{"-device", "e1000e,id=nic1,bus=pcie.0,addr=0x05,mac=52:54:00:12:34:05,ats=off"}, resolved[1].qemuArgs(1))
	back, err := ParseNICs(FormatNICs(resolved))
	require.NoError(t, err)
	require.Equal(t, resolved, back)

	// ResolveNICs refuses what ParseNICs refuses, for NICs built in Go.
	for _, p := range []map[string]string{{"mac": "02:00:00:00:00:01"}, {"x": "a,romfile=y"}, {"x": ""}, {"": "1"}} {
		_, err := ResolveNICs([]NIC{{Model: E1000E, Props: p}})
		require.ErrorIs(t, err, ErrBadConfig, "%v", p)
	}

	// Names and values are checked against what QEMU lists for the model.
	fake := filepath.Join(t.TempDir(), "fake-qemu")
	probeMu.Lock()
	probeCache[fake] = &QEMUInfo{Path: fake, Version: "10.0.2", NICModels: []string{"virtio-net-pci"}}
	probeMu.Unlock()
	propsMu.Lock()
	propsCache[fake+"\x00virtio-net-pci"] = parseDeviceProps("virtio-net-pci options:\n" +
		"  event_idx=<bool>       - on/off (default: on)\n" +
		"  host_mtu=<uint16>      -  (default: 0)\n" +
		"  speed=<int32>          -  (default: -1)\n" +
		"  duplex=<str>\n")
	propsMu.Unlock()
	for _, c := range []struct{ props, msg string }{
		{"evnt_idx=off", `has no property "evnt_idx" (it has: duplex, event_idx, host_mtu, speed)`},
		{"event_idx=maybe", `property event_idx: "maybe" is not a bool`},
		{"host_mtu=65536", `property host_mtu: "65536" is not a uint16 (0 to 65535)`},
		{"speed=fast", `property speed: "fast" is not an int32`},
	} {
		n, err := ParseNICs("virtio," + c.props)
		require.NoError(t, err)
		_, err = Run(context.Background(), Config{QEMU: fake, NICs: n}, Command{GuestPath: "/bin/true"})
		require.ErrorIs(t, err, ErrBadConfig, c.props)
		require.ErrorContains(t, err, c.msg)
	}
}

func TestFreeUDPPorts(t *testing.T) {
	p, err := FreeUDPPorts(4)
	require.NoError(t, err)
	seen := map[int]bool{}
	for _, x := range p {
		require.False(t, seen[x])
		require.Positive(t, x)
		seen[x] = true
	}
	nd, err := NewDgram()
	require.NoError(t, err)
	require.Equal(t, NetDgram, nd.Kind)
	require.NotEqual(t, nd.QEMUPort, nd.HostPort)
	_, err = FreeUDPPorts(-1)
	require.ErrorIs(t, err, ErrBadConfig)
}

func TestParseProbeOutput(t *testing.T) {
	help := `Controller/Bridge/Hub devices:
name "pcie-root-port", bus PCI

Network devices:
name "e1000e", bus PCI, desc "Intel 82574L GbE Controller"
name "igb", bus PCI, desc "Intel 82576 Gigabit Ethernet Controller"
name "usb-net", bus usb-bus
name "virtio-net-pci", bus PCI, alias "virtio-net"
name "vmxnet3", bus PCI, desc "VMWare Paravirtualized Ethernet v3"

Storage devices:
name "nvme", bus PCI
`
	q := &QEMUInfo{NICModels: parseNICModels(help)}
	require.Equal(t, []string{"e1000e", "igb", "virtio-net-pci", "vmxnet3"}, q.NICModels)
	require.True(t, q.HasNIC(IGB))
	require.False(t, q.HasNIC("nvme"))
	v, maj, minor := parseVersion("QEMU emulator version 7.2.15 (Debian 1:7.2+dfsg-7+deb12u13)\n")
	require.Equal(t, "7.2.15", v)
	require.Equal(t, [2]int{7, 2}, [2]int{maj, minor})
}

func TestNICUnavailable(t *testing.T) {
	fake := filepath.Join(t.TempDir(), "fake-qemu")
	probeMu.Lock()
	probeCache[fake] = &QEMUInfo{Path: fake, Version: "7.2.0", NICModels: []string{"e1000e", "virtio-net-pci"}}
	probeMu.Unlock()
	_, err := Run(context.Background(), Config{QEMU: fake, NICs: []NIC{{Model: IGB}}}, Command{GuestPath: "/bin/true"})
	require.ErrorIs(t, err, ErrNICUnavailable)
	require.Contains(t, err.Error(), "igb")
}

func TestConfigErrors(t *testing.T) {
	cases := []struct {
		cfg Config
		cmd Command
	}{
		{Config{}, Command{}},
		{Config{}, Command{Path: "/x", GuestPath: "/y"}},
		{Config{}, Command{GuestPath: "relative"}},
		{Config{}, Command{GuestPath: "/bin/true", Env: []string{"1BAD=x"}}},
		{Config{}, Command{GuestPath: "/bin/true", Dir: "tmp"}},
		{Config{MemoryMB: 64}, Command{GuestPath: "/bin/true"}},
		{Config{AWBits: 12}, Command{GuestPath: "/bin/true"}},
		{Config{Hugepages: 600}, Command{GuestPath: "/bin/true"}},
		{Config{Files: []File{{Host: "/etc/hosts", Guest: "rel"}}}, Command{GuestPath: "/bin/true"}},
	}
	for i, c := range cases {
		_, err := Run(context.Background(), c.cfg, c.cmd)
		require.ErrorIs(t, err, ErrBadConfig, "case %d", i)
	}
}

func TestFindKernelIn(t *testing.T) {
	root := t.TempDir()
	_, err := FindKernelIn(root)
	require.ErrorIs(t, err, ErrNoKernel)
	require.Contains(t, err.Error(), filepath.Join(root, "boot"))
	require.Contains(t, err.Error(), "scripts/setup.sh")
	for _, v := range []string{"6.1.0-9-amd64", "6.1.0-56-amd64", "6.1.0-100-amd64"} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, "boot"), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, "boot", "vmlinuz-"+v), nil, 0o644))
	}
	_, err = FindKernelIn(root)
	require.ErrorIs(t, err, ErrNoKernel, "no modules.dep yet")
	for _, v := range []string{"6.1.0-9-amd64", "6.1.0-56-amd64"} {
		md := filepath.Join(root, "lib", "modules", v)
		require.NoError(t, os.MkdirAll(md, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(md, "modules.dep"), nil, 0o644))
	}
	k, err := FindKernelIn(root)
	require.NoError(t, err)
	require.Equal(t, "6.1.0-56-amd64", k.Version, "newest with modules")
	require.Equal(t, filepath.Join(root, "lib", "modules", "6.1.0-56-amd64"), k.ModulesDir)
}

// TestFindBackportsKernel: the second kernel is looked for in its own
// folder of the cache, never the default kernel's.
func TestFindBackportsKernel(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("VFNIC_CACHE", cache)
	for _, k := range []struct{ d, v string }{{"kernel", "6.1.0-56-amd64"}, {"kernel-bpo", "7.3.4+deb13-amd64"}} {
		d, v := k.d, k.v
		require.NoError(t, os.MkdirAll(filepath.Join(cache, d, "boot"), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(cache, d, "boot", "vmlinuz-"+v), nil, 0o644))
		require.NoError(t, os.MkdirAll(filepath.Join(cache, d, "lib", "modules", v), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(cache, d, "lib", "modules", v, "modules.dep"), nil, 0o644))
	}
	k, err := FindBackportsKernel()
	require.NoError(t, err)
	require.Equal(t, "7.3.4+deb13-amd64", k.Version)
	require.Equal(t, filepath.Join(cache, "kernel-bpo", "boot", "vmlinuz-7.3.4+deb13-amd64"), k.Image)
	k, err = FindKernel()
	require.NoError(t, err)
	require.Equal(t, "6.1.0-56-amd64", k.Version, "the default stays bookworm's")
	require.NoError(t, os.RemoveAll(filepath.Join(cache, "kernel-bpo")))
	_, err = FindBackportsKernel()
	require.ErrorIs(t, err, ErrNoKernel)
}

func TestEnvLookups(t *testing.T) {
	t.Setenv("VFNIC_CACHE", "/x/cache")
	require.Equal(t, "/x/cache", CacheDir())
	t.Setenv("VFNIC_CACHE", "")
	t.Setenv("XDG_CACHE_HOME", "/x/xdg")
	require.Equal(t, "/x/xdg/vfnic", CacheDir())

	t.Setenv("VFNIC_QEMU", "/nonexistent/qemu")
	_, err := FindQEMU()
	require.ErrorIs(t, err, ErrNoQEMU)
	require.Contains(t, err.Error(), "/nonexistent/qemu")

	t.Setenv("VFNIC_BUSYBOX", "/etc/hosts")
	_, err = FindBusybox()
	require.ErrorIs(t, err, ErrNoBusybox)
}

func TestCheckPVHRejects(t *testing.T) {
	require.Error(t, checkPVH([]byte("not an elf")))
	_, err := extractVmlinux(context.Background(), []byte("no compressed stream in here"))
	require.Error(t, err)
}

func testInitParams() initParams {
	nics, _ := ResolveNICs([]NIC{
		{Model: VirtioNet, Packed: true},
		{Model: E1000E, Bind: BindLinux, IPv4: "10.0.0.2/24"},
		{Model: IGB, Bind: BindNone},
	})
	return initParams{
		Modules:   []string{"/lib/modules/v/kernel/virt/lib/irqbypass.ko", "/lib/modules/v/kernel/drivers/vfio/vfio.ko"},
		Hugepages: 32,
		NICs:      nics,
		Argv:      []string{"/vfnic/bin/payload", "-test.v", "it's quoted"},
		Env:       []string{"A=b c"},
		Dir:       "/vfnic/pkg",
		Nonce:     "abc123",
		Collect:   []Collect{{Guest: "/vfnic/out/a.pcap", Host: "/h/a.pcap"}, {Guest: "/vfnic/cover/", Host: "/h/cover", Dir: true}},
	}
}

func TestInitScript(t *testing.T) {
	s := initScript(testInitParams())
	steps := []string{
		"mount -t proc proc /proc",
		"mount -t devtmpfs devtmpfs /dev",
		`echo "VFNIC-KERNEL: $(uname -r)"`,
		"echo vfio-pci > /sys/bus/pci/devices/0000:00:04.0/driver_override",
		"echo none > /sys/bus/pci/devices/0000:00:06.0/driver_override",
		"insmod '/lib/modules/v/kernel/virt/lib/irqbypass.ko'",
		"insmod '/lib/modules/v/kernel/drivers/vfio/vfio.ko'",
		"echo 32 > /proc/sys/vm/nr_hugepages",
		"bind_vfio 0000:00:04.0",
		"bind_linux 0000:00:05.0 '10.0.0.2/24'",
		"cd '/vfnic/pkg'",
		"mkdir -p '/vfnic/out'",
		"mkdir -p '/vfnic/cover'",
		"dmesg -n 4",
		"echo 'VFNIC-BEGIN abc123'",
		"env -i 'VFNIC_GUEST=1' 'HOME=/root' 'TMPDIR=/tmp' 'PATH=/bin:/sbin:/usr/bin:/usr/sbin' 'A=b c' '/vfnic/bin/payload' '-test.v' 'it'\\''s quoted' </dev/null",
		"echo 'VFNIC-END abc123'",
		`echo "VFNIC-EXIT: $rc"`,
		"collect 'vfnic/out/a.pcap' 'vfnic/cover'",
		"echo 'VFNIC-KLOG abc123'",
		"poweroff -f",
	}
	pos := 0
	for _, st := range steps {
		i := strings.Index(s[pos:], st)
		require.GreaterOrEqual(t, i, 0, "step %q missing or out of order in:\n%s", st, s)
		pos += i + len(st)
	}
	require.NotContains(t, s, "bind_vfio 0000:00:05.0")
	require.NotContains(t, s, "bind_vfio 0000:00:06.0")

	// The script must parse under the shell that runs it.
	bb, err := FindBusybox()
	if err != nil {
		t.Skipf("no busybox to syntax-check /init: %v", err)
	}
	f := filepath.Join(t.TempDir(), "init")
	require.NoError(t, os.WriteFile(f, []byte(s), 0o755))
	out, err := exec.Command(bb, "sh", "-n", f).CombinedOutput()
	require.NoError(t, err, "busybox sh -n: %s", out)
}

func TestShQuoteRoundTrip(t *testing.T) {
	bb, err := FindBusybox()
	if err != nil {
		t.Skipf("no busybox: %v", err)
	}
	words := []string{"plain", "with space", "it's", `"dq" $HOME \back`, "", "new\nline"}
	out, err := exec.Command(bb, "sh", "-c", "for w in "+shWords(words)+`; do printf '%s\0' "$w"; done`).Output()
	require.NoError(t, err)
	require.Equal(t, words, strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00"))
}

func TestConsoleParsing(t *testing.T) {
	var live, liveOut bytes.Buffer
	c := newConsole("n1", &live, &liveOut)
	stream := "[    1.0] noise\r\nVFNIC-KERNEL: 6.1.0-56-amd64\r\n" +
		"VFNIC-VFIO: 0000:00:04.0 group 1\r\n" +
		"VFNIC-BEGIN n1\r\nline one\r\nVFNIC-END other\r\nlast without newlineVFNIC-END n1\r\n" +
		"VFNIC-EXIT: 3\r\nVFNIC-KLOG n1\r\n[ 2.0] DMAR: fault\r\nVFNIC-KLOG-END n1\r\n[    3.0] reboot: Power down"
	// Feed in awkward pieces: markers split across writes.
	for i := 0; i < len(stream); i += 7 {
		_, err := c.Write([]byte(stream[i:min(i+7, len(stream))]))
		require.NoError(t, err)
	}
	c.flush()
	require.Equal(t, "6.1.0-56-amd64", c.kernelVersion)
	require.Equal(t, "line one\nVFNIC-END other\nlast without newline", c.out.String(), "a foreign nonce does not end the capture")
	require.Equal(t, c.out.String(), liveOut.String())
	require.True(t, c.haveExit)
	require.Equal(t, 3, c.exitCode)
	require.Equal(t, "[ 2.0] DMAR: fault\n", c.klog.String())
	require.Equal(t, []string{"VFNIC-VFIO: 0000:00:04.0 group 1"}, c.info)
	require.NotContains(t, live.String(), "\r")
	require.Equal(t, phaseDone, c.phase)
	require.Equal(t, "[    3.0] reboot: Power down", c.tail(1))

	c = newConsole("n2", nil, nil)
	_, _ = c.Write([]byte("VFNIC-KERNEL: v\nVFNIC-ERROR: insmod vfio\n"))
	require.Equal(t, phaseSetup, c.phase)
	require.Equal(t, "insmod vfio", c.setupErr)
}

// sampleTestOutput is a test binary's -test.v=test2json output: framing
// lines start with ^V (0x16). TestD panics and never reports.
const sampleTestOutput = "\x16=== RUN   TestA\n" +
	"    a_test.go:10: hello from A\n" +
	"\x16--- PASS: TestA (0.01s)\n" +
	"\x16=== RUN   TestB\n" +
	"\x16=== RUN   TestB/one\n" +
	"    b_test.go:5: sub log\n" +
	"\x16--- PASS: TestB/one (0.10s)\n" +
	"\x16=== NAME  TestB\n" +
	"\x16=== RUN   TestB/two\n" +
	"    b_test.go:9: skipping\n" +
	"\x16--- SKIP: TestB/two (0.00s)\n" +
	"\x16=== NAME  TestB\n" +
	"\x16--- FAIL: TestB (0.20s)\n" +
	"\x16=== RUN   TestC\n" +
	"    c_test.go:3: boom\n" +
	"\x16--- SKIP: TestC (0.00s)\n" +
	"\x16=== RUN   TestBig\n" +
	"\x16--- PASS: TestBig (10000000000.00s)\n" +
	"\x16=== RUN   TestD\n" +
	"panic: runtime error\n" +
	"FAIL\n"

func TestParseTestOutput(t *testing.T) {
	ctx := t.Context()
	res, err := ParseTestOutput(ctx, "p", sampleTestOutput)
	require.NoError(t, err)
	got := map[string]TestStatus{}
	for _, r := range res {
		got[r.Name] = r.Status
	}
	require.Equal(t, map[string]TestStatus{
		"TestA": TestPass, "TestB": TestFail, "TestB/one": TestPass, "TestB/two": TestSkip,
		"TestC": TestSkip, "TestBig": TestPass, "TestD": TestFail,
	}, got)
	require.Equal(t, "TestA", res[0].Name)
	require.Equal(t, "    a_test.go:10: hello from A\n", res[0].Output, "framing lines left out")
	require.Equal(t, 10*time.Millisecond, res[0].Elapsed)
	for _, r := range res {
		switch r.Name {
		case "TestB/one":
			require.Contains(t, r.Output, "sub log")
			require.Equal(t, 100*time.Millisecond, r.Elapsed)
		case "TestBig":
			// 1e10 s is past int64 nanoseconds: it saturates, never wraps negative.
			require.Equal(t, time.Duration(math.MaxInt64), r.Elapsed)
		case "TestD":
			require.Contains(t, r.Output, "panic: runtime error")
			require.Contains(t, r.Output, "no result reported")
		}
	}

	parse := func(out string) []TestResult {
		res, err := ParseTestOutput(ctx, "p", out)
		require.NoError(t, err)
		return res
	}
	rep := &TestReport{Package: "p", Tests: res}
	require.ErrorIs(t, rep.verdict(nil), ErrTestsFailed)
	rep = &TestReport{Package: "p", Tests: parse("\x16=== RUN   TestS\n\x16--- SKIP: TestS (0.00s)\n")}
	require.ErrorIs(t, rep.verdict(nil), ErrTestsSkipped)
	rep.AllowSkip = true
	require.NoError(t, rep.verdict(nil))
	rep = &TestReport{Package: "p", Tests: parse("testing: warning: no tests to run\nPASS\n")}
	require.ErrorIs(t, rep.verdict(nil), ErrNoTests)
	// Plain -test.v=true text is read too.
	rep = &TestReport{Package: "p", Tests: parse("=== RUN   TestA\n--- PASS: TestA (0.00s)\n")}
	require.NoError(t, rep.verdict(nil))
	require.ErrorIs(t, rep.verdict(ErrPayloadFailed), ErrTestsFailed, "non-zero exit without a failed test")
}

func TestParseTestEvents(t *testing.T) {
	events := `{"Action":"run","Package":"p","Test":"TestX"}
{"Action":"output","Package":"p","Test":"TestX","Output":"=== RUN   TestX\n"}
{"Action":"output","Package":"p","Test":"TestX","Output":"    x_test.go:1: log\n"}
{"Action":"pass","Package":"p","Test":"TestX","Elapsed":1e12}
{"Action":"run","Package":"p","Test":"TestY"}
{"Action":"fail","Package":"p","Test":"TestY","Elapsed":-1}
{"Action":"pass","Package":"p","Elapsed":0.5}
`
	res, err := ParseTestEvents(strings.NewReader(events))
	require.NoError(t, err)
	require.Equal(t, []TestResult{
		{Name: "TestX", Status: TestPass, Elapsed: math.MaxInt64, Output: "    x_test.go:1: log\n"},
		{Name: "TestY", Status: TestFail},
	}, res)
	_, err = ParseTestEvents(strings.NewReader("{not json"))
	require.Error(t, err)
}

func TestTestArgs(t *testing.T) {
	require.Equal(t, []string{"-test.v=test2json", "-test.run=TestX", "-test.timeout=2m40s", "-test.count=1"},
		TestArgs(Config{}, GoTest{Run: "TestX", Args: []string{"-test.count=1"}}))
	require.Equal(t, []string{"-test.v=test2json", "-test.timeout=5s"},
		TestArgs(Config{Timeout: time.Hour}, GoTest{Args: []string{"-test.timeout=5s"}}))
	require.Equal(t, []string{"-test.v=test2json"}, TestArgs(Config{Timeout: 30 * time.Second}, GoTest{}))
}

// TestRealModulesResolve checks the VFIO chain against the installed guest
// kernel's modules.dep (no VM needed).
func TestRealModulesResolve(t *testing.T) {
	k, err := FindKernel()
	if err != nil {
		if InCI() {
			t.Fatalf("%v", err)
		}
		t.Skipf("%v", err)
	}
	m, err := initramfs.LoadModules(k.ModulesDir)
	require.NoError(t, err)
	mods, err := m.Resolve(vfioModules...)
	require.NoError(t, err)
	var names []string
	for _, mod := range mods {
		names = append(names, mod.Name)
	}
	for _, want := range []string{"irqbypass", "vfio", "vfio_virqfd", "vfio_iommu_type1", "vfio_pci_core", "vfio_pci"} {
		require.Contains(t, names, want)
	}
	require.Equal(t, "vfio_pci", names[len(names)-2], "vfio_pci after its chain: %v", names)
}

func TestStripFraming(t *testing.T) {
	var b bytes.Buffer
	w := stripFraming{&b}
	for _, s := range []string{"\x16=== RUN   TestA\n", "  log\n", "\x16--- PASS: TestA (0.00s)\n"} {
		n, err := w.Write([]byte(s))
		require.NoError(t, err)
		require.Equal(t, len(s), n)
	}
	require.Equal(t, "=== RUN   TestA\n  log\n--- PASS: TestA (0.00s)\n", b.String())
}

// TestLineLogger: the guest's output reaches the log a whole line at a
// time, prefixed, however the writes cut it.
func TestLineLogger(t *testing.T) {
	var got []string
	l := &lineLogger{logf: func(f string, a ...any) { got = append(got, fmt.Sprintf(f, a...)) }}
	for _, w := range []string{"=== RUN   TestX\n--- PA", "SS: TestX (0.00s)\r\n", "partial"} {
		n, err := l.Write([]byte(w))
		require.NoError(t, err)
		require.Equal(t, len(w), n)
	}
	require.Equal(t, []string{"guest: === RUN   TestX", "guest: --- PASS: TestX (0.00s)"}, got)
}

// TestEmulatorFault: a QEMU that died of a signal is told from one that
// exited, and RunGoTestT runs the guest again only when no guest test had
// failed before the crash, or when the guest did not boot.
func TestEmulatorFault(t *testing.T) {
	require.Equal(t, "aborted", exitSignal(exec.Command("sh", "-c", "kill -ABRT $$").Run()))
	require.Empty(t, exitSignal(exec.Command("sh", "-c", "exit 3").Run()))
	require.Empty(t, exitSignal(nil))

	out := "\x16=== RUN   TestA\n\x16--- PASS: TestA (0.00s)\n\x16=== RUN   TestB\n"
	tests, err := ParseTestOutput(t.Context(), "p", out)
	require.NoError(t, err)
	crashed := &TestReport{Result: &Result{Signal: "aborted"}, Tests: tests}
	require.Contains(t, emulatorFault(crashed, ErrPayloadIncomplete), "QEMU crashed (signal: aborted)", "TestB cut short by the crash: %+v", tests)
	require.Empty(t, emulatorFault(&TestReport{Result: &Result{}, Tests: tests}, ErrPayloadIncomplete), "QEMU exited")
	require.Empty(t, emulatorFault(nil, nil))
	require.NotEmpty(t, emulatorFault(&TestReport{Result: &Result{}}, fmt.Errorf("%w: the kernel did not reach /init", ErrBootFailed)))

	failedFirst, err := ParseTestOutput(t.Context(), "p", "\x16=== RUN   TestA\n\x16--- FAIL: TestA (0.00s)\n"+"\x16=== RUN   TestB\n")
	require.NoError(t, err)
	require.Empty(t, emulatorFault(&TestReport{Result: &Result{Signal: "aborted"}, Tests: failedFirst}, ErrPayloadIncomplete),
		"a guest test failed before the crash: that is the verdict")
}
