package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/nic"
)

func runCLI(args ...string) (int, string, string) {
	var out, errw bytes.Buffer
	code := run(args, &out, &errw)
	return code, out.String(), errw.String()
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "usage: vfnic"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"bind"}, "name at least one PCI address"},
		{[]string{"bind", "00:zz.0"}, "bad address"},
		{[]string{"unbind", "0000:7f:1f.9"}, "bad address"},
		{[]string{"list", "extra"}, "takes no arguments"},
		{[]string{"list", "-nosuchflag"}, "flag provided but not defined"},
		{[]string{"probe"}, "name at least one PCI address"},
		{[]string{"demo"}, `unknown command "demo"`}, // cmd/vfnic-demo now
		// Flags after the address are parsed, so their errors are theirs.
		{[]string{"echo", "0000:7f:1f.0", "-ip", "x"}, `-ip needs an IPv4 address, got "x"`},
		{[]string{"echo", "-ip", "10.0.0.1", "0000:7f:1f.0", "0000:7f:1f.1"}, "name one PCI address"},
		{[]string{"echo", "-ip", "10.0.0.1", "--", "-x"}, "bad address"},
		{[]string{"pktgen", "0000:7f:1f.0", "-size", "70000"}, "-size 70000 outside [60, 65535]"},
		{[]string{"capture"}, "name the NIC's PCI address"},
		{[]string{"capture", "-w", "x"}, "name the NIC's PCI address"},
		{[]string{"capture", "icmp", "-w", "x"}, "the PCI address comes first (or with -i), then the filter expression"},
		{[]string{"capture", "0000:7f:1f.0", "tcp", "prot", "80"}, `filter: column 5: want "and", "or" or the end of the expression, got "prot" (did you mean "port"?)`},
		{[]string{"capture", "0000:7f:1f.0", "tcp prot 80"}, "\n  tcp prot 80\n      ^"},
		{[]string{"capture", "-i", "0000:7f:1f.0", "host"}, `filter: column 5: want an IPv4 or IPv6 address after "host", got the end of the expression`},
		{[]string{"capture", "-i", "0000:7f:1f.0", "0000:7f:1f.1"}, "filter: column 1"},
		{[]string{"capture", "0000:7f:1f.0", "-w", "x", "tcp[13]", "&", "2", "!=", "0"}, "packet-data accessors (tcp[13], ip[2:2]) are not supported"},
		{[]string{"capture", "-json", "0000:7f:1f.0"}, "-json and the frame lines (no -w) both want stdout"},
		{[]string{"capture", "-c", "-1", "0000:7f:1f.0"}, "-count -1 is negative"},
		{[]string{"capture", "-s", "3", "0000:7f:1f.0"}, "-snaplen 3 outside [14, 262144] (0: whole frames)"},
		{[]string{"capture", "-snaplne", "3", "0000:7f:1f.0"}, "flag provided but not defined: -snaplne (did you mean -snaplen?)"},
		{[]string{"pktgen", "-rat", "3", "0000:7f:1f.0"}, "flag provided but not defined: -rat (did you mean -rate?)"},
		{[]string{"sink", "0000:7f:1f.0", "-cont", "3"}, "flag provided but not defined: -cont (did you mean -count?)"},
		{[]string{"list", "-jsno"}, "(did you mean -json?)"},
		{[]string{"bind", "-forec", "0000:7f:1f.0"}, "(did you mean -force?)"},
		{[]string{"captur"}, `unknown command "captur" (did you mean "capture"?)`},
		{[]string{"info"}, "name one PCI address"},
		{[]string{"fwd", "0000:7f:1f.0"}, "name two PCI addresses: the ports to forward between"},
		{[]string{"fwd", "0000:7f:1f.0", "7f:1f.0"}, "0000:7f:1f.0 twice: name two ports"},
		{[]string{"fwd", "-forward", "mac", "0000:7f:1f.0", "0000:7f:1f.1"}, `-forward "mac": want io or macswap`},
		{[]string{"info", "0000:7f:1f.0", "0000:7f:1f.1"}, "name one PCI address"},
		{[]string{"info", "-json", "zz"}, `bad address "zz"`},
		{[]string{"info", "-jsn", "0000:7f:1f.0"}, "(did you mean -json?)"},
		{[]string{"capture", "-w", "-", "-json", "0000:7f:1f.0"}, "both want stdout"},
		{[]string{"capture", "-w", "x", "-snaplen", "3", "0000:7f:1f.0"}, "-snaplen 3 outside [14, 262144]"},
		{[]string{"sink", "-count", "-1", "0000:7f:1f.0"}, "-count -1 is negative"},
		{[]string{"sink", "-queues", "0", "0000:7f:1f.0"}, "-queues 0 outside [1, 64]"},
		{[]string{"sink", "-queues", "65", "0000:7f:1f.0"}, "-queues 65 outside [1, 64]"},
		{[]string{"pktgen", "-queues", "0", "0000:7f:1f.0"}, "-queues 0 outside [1, 64]"},
		{[]string{"capture", "-queues", "65", "0000:7f:1f.0"}, "-queues 65 outside [1, 64]"},
		{[]string{"echo", "-ip", "10.0.0.1", "-queues", "-1", "0000:7f:1f.0"}, "-queues -1 outside [1, 64]"},
		{[]string{"fwd", "-queues", "0", "0000:7f:1f.0", "0000:7f:1f.1"}, "-queues 0 outside [1, 64]"},
		{[]string{"pktgen", "-queues", "2", "-cpu", "1000000", "0000:7f:1f.0"}, "(CPU 1000001 for a queue's core): not a CPU this process may run on"},
		{[]string{"sink", "-queues", "2", "-cpu", "1000000", "0000:7f:1f.0"}, "(CPU 1000001 for a queue's core): not a CPU this process may run on"},
		// Every traffic command's device flags, before the device is opened.
		{[]string{"pktgen", "0000:7f:1f.0", "-queue-size", "-1"}, "-queue-size -1 is negative"},
		{[]string{"sink", "-buffer-size", "-2048", "0000:7f:1f.0"}, "-buffer-size -2048 is negative"},
		{[]string{"echo", "-ip", "10.0.0.1", "-duration", "-1s", "0000:7f:1f.0"}, "-duration -1s is negative"},
		{[]string{"capture", "-w", "/dev/null", "-progress", "-1s", "0000:7f:1f.0"}, "-progress -1s is negative"},
		{[]string{"pktgen", "-count", "0", "-duration", "-1s", "0000:7f:1f.0"}, "-duration -1s is negative"},
		{[]string{"pktgen", "-count", "-5", "-duration", "1s", "0000:7f:1f.0"}, "-count -5 is negative"},
		{[]string{"pktgen", "-rate", "NaN", "0000:7f:1f.0"}, "-rate NaN is not a finite number"},
		{[]string{"pktgen", "-rate", "Inf", "0000:7f:1f.0"}, "-rate +Inf is not a finite number"},
		{[]string{"pktgen", "-rate", "-Inf", "0000:7f:1f.0"}, "-rate -Inf is not a finite number"},
		{[]string{"pktgen", "-rate", "-5", "0000:7f:1f.0"}, "-rate -5 is negative"},
		{[]string{"pktgen", "-dst-mac", "00:11:22:33:44:55:66:77", "0000:7f:1f.0"}, `-dst-mac "00:11:22:33:44:55:66:77" is not a 6-byte Ethernet address`},
		{[]string{"pktgen", "-dst-mac", "zz", "0000:7f:1f.0"}, "-dst-mac"},
		{[]string{"pktgen", "-dst-mac", "02:00:00:00:00:09-02:00:00:00:00:01", "0000:7f:1f.0"}, "-dst-mac 02:00:00:00:00:09-02:00:00:00:00:01: the range is reversed"},
		{[]string{"pktgen", "-src-mac", "02:00:00:00:00:01-zz", "0000:7f:1f.0"}, `-src-mac "02:00:00:00:00:01-zz" is not a 6-byte Ethernet address (or a range A-B of them)`},
		{[]string{"pktgen", "-src-ip", "10.0.0.1-2001:db8::1", "0000:7f:1f.0"}, "-src-ip 10.0.0.1-2001:db8::1: both ends must be IPv4, or both IPv6"},
		{[]string{"pktgen", "-src-ip", "2001:db8::1", "0000:7f:1f.0"}, "-src-ip 2001:db8::1 and -dst-ip 10.0.0.2: both IPv4 or both IPv6"},
		{[]string{"pktgen", "-src-ip", "2001:db8::1-2001:db9::1", "-dst-ip", "::1", "0000:7f:1f.0"}, "an IPv6 range may differ in its low 64 bits only"},
		{[]string{"pktgen", "-dst-ip", "10.0.0.9-10.0.0.1", "0000:7f:1f.0"}, "-dst-ip 10.0.0.9-10.0.0.1: the range is reversed"},
		{[]string{"pktgen", "-dst-ip", "host", "0000:7f:1f.0"}, `-dst-ip "host": want an IPv4 or IPv6 address, or a range A-B`},
		{[]string{"pktgen", "-port", "100-10", "0000:7f:1f.0"}, "-port 100-10: the range is reversed"},
		{[]string{"pktgen", "-port", "0", "0000:7f:1f.0"}, "-port 0 outside [1, 65535]"},
		{[]string{"pktgen", "-src-port", "9-x", "0000:7f:1f.0"}, `-src-port "9-x": want N or N-M`},
		{[]string{"pktgen", "-size", "64-20", "0000:7f:1f.0"}, "-size 64-20: the range is reversed"},
		{[]string{"pktgen", "-size", "64", "-size-mix", "64:1", "0000:7f:1f.0"}, "-size and -size-mix both set"},
		{[]string{"pktgen", "-size-mix", "64", "0000:7f:1f.0"}, `-size-mix "64": want SIZE:COUNT,...`},
		{[]string{"pktgen", "-size-mix", "64:1,20:1", "0000:7f:1f.0"}, "sizes 20 to 64: a frame takes 60 to 65535 bytes here"},
		{[]string{"pktgen", "-size-mix", "64:5000", "0000:7f:1f.0"}, "more than 4096 frames in a cycle"},
		{[]string{"pktgen", "-src-ip", "::1", "-dst-ip", "::2", "-vlan", "5", "0000:7f:1f.0"}, "sizes 64 to 64: a frame takes 74 to 65535 bytes here"},
		{[]string{"udpping", "-size", "4", "127.0.0.1:7"}, "-size 4 outside [8, 65507]"},
		{[]string{"help", "nosuch"}, `unknown command "nosuch"`},
		{[]string{"version", "x"}, "takes no arguments"},
	} {
		code, out, errw := runCLI(tc.args...)
		require.Equal(t, exitUsage, code, "%v: %s", tc.args, errw)
		require.Contains(t, strings.ToLower(errw), strings.ToLower(tc.want), "%v", tc.args)
		require.Empty(t, out, "%v: errors go to stderr", tc.args)
		require.NotContains(t, errw, "not found", "%v: refused before the device is looked up", tc.args)
	}
}

// TestFlagOrder: flags before, after or around the address mean the same.
// The device does not exist on the host, so each line gets as far as
// opening it: a failure (1) naming the address, never a usage error.
func TestFlagOrder(t *testing.T) {
	for _, args := range [][]string{
		{"echo", "-ip", "10.0.0.1", "-duration", "1s", "0000:7f:1f.7"},
		{"echo", "0000:7f:1f.7", "-ip", "10.0.0.1", "-duration", "1s"},
		{"echo", "-ip", "10.0.0.1", "0000:7f:1f.7", "-duration=1s"},
		{"pktgen", "0000:7f:1f.7", "-rate", "1000", "-duration", "1s"},
		{"pktgen", "0000:7f:1f.7"},                   // until interrupted: no -count, no -duration
		{"pktgen", "-size", "20000", "0000:7f:1f.7"}, // the device's limit is checked once it is found
		{"pktgen", "-src-ip", "2001:db8::1-2001:db8::ff", "-dst-ip", "2001:db8::1:1", "-size-mix", "78:7,594:4,1518:1", "0000:7f:1f.7"},
		{"pktgen", "0000:7f:1f.7", "-src-port", "1000-1063", "-port", "9-10", "-dst-mac", "02:00:00:00:00:01-02:00:00:00:00:04", "-size", "60-1514"},
		{"capture", "0000:7f:1f.7", "-w", "/dev/null", "-p"},
	} {
		code, _, errw := runCLI(args...)
		require.Equal(t, exitFailure, code, "%v: %s", args, errw)
		require.Contains(t, errw, "0000:7f:1f.7", "%v", args)
		require.Contains(t, errw, "not found", "%v", args)
	}
}

func TestParseInterleaved(t *testing.T) {
	fs := newFlags("t", "")
	n := fs.Int("n", 0, "")
	b := fs.Bool("b", false, "")
	require.NoError(t, parse(fs, []string{"a", "-n", "3", "b", "-b", "--", "-n", "c"}))
	require.Equal(t, 3, *n)
	require.True(t, *b)
	require.Equal(t, []string{"a", "b", "-n", "c"}, fs.Args())

	fs = newFlags("t", "")
	require.ErrorIs(t, parse(fs, []string{"x", "-nope"}), errUsage)
	fs = newFlags("t", "ARGS")
	fs.Int("n", 0, "the n")
	err := parse(fs, []string{"x", "-h"})
	require.ErrorIs(t, err, flag.ErrHelp)
	var h *helpError
	require.ErrorAs(t, err, &h)
	require.Contains(t, h.usage, "usage: vfnic t ARGS")
	require.Contains(t, h.usage, "the n")
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}} {
		code, out, errw := runCLI(args...)
		require.Equal(t, exitOK, code)
		require.Empty(t, errw, "help goes to stdout")
		for name := range commands {
			require.Contains(t, out, name)
		}
		require.Contains(t, out, "Exit status: 0 success")
	}
	for name := range commands {
		if name == "help" {
			continue
		}
		for _, args := range [][]string{{"help", name}, {name, "-h"}, {name, "-help"}} {
			code, out, errw := runCLI(args...)
			require.Equal(t, exitOK, code, "%v: %s", args, errw)
			require.Empty(t, errw, "%v: help goes to stdout", args)
			require.Contains(t, out, "usage: vfnic "+name, "%v", args)
			require.Contains(t, out, commands[name].summary, "%v", args)
		}
	}
	_, out, _ := runCLI("help", "capture")
	for _, f := range []string{"-snaplen", "-buffer-size", "-json", "-no-promisc", "-w string"} {
		require.Contains(t, out, f)
	}
	_, out, _ = runCLI("help", "pktgen")
	require.Contains(t, out, "-rate")
	require.Contains(t, out, "-duration")
	// Help and behaviour agree: no -count and no -duration sends until interrupted.
	require.Regexp(t, `-count int\n\s+frames to send \(0: until -duration or interrupted\)\n`, out, "default 0, so no '(default ...)'")
	require.Equal(t, "until interrupted (Ctrl-C)", stopNote(0, 0))
	require.Equal(t, "for 2s", stopNote(0, 2*time.Second))
	require.Equal(t, "until 5 frames are sent", stopNote(5, 0))
	_, out, _ = runCLI("help", "capture")
	for _, f := range []string{"-c int", "-s int", "-i DEVICE", "-n\t", "-p\t", "-w string", "pcap-filter(7)"} {
		require.Contains(t, out, f)
	}
}

func TestVersion(t *testing.T) {
	code, out, errw := runCLI("version")
	require.Equal(t, exitOK, code, errw)
	require.True(t, strings.HasPrefix(out, "vfnic github.com/vfnic/vfnic "), out)
	require.Contains(t, out, runtime.Version())
	// This test binary also links nic/softnic (softnic_test.go); vfnic's
	// own has afpacket, afxdp, igb and virtio.
	require.Contains(t, out, "\n  drivers: afpacket, afxdp, igb, softnic, virtio\n", "the drivers compiled in")

	code, out, errw = runCLI("version", "-json")
	require.Equal(t, exitOK, code, errw)
	var v versionInfo
	require.NoError(t, json.Unmarshal([]byte(out), &v), out)
	require.Equal(t, "github.com/vfnic/vfnic", v.Module)
	require.Equal(t, runtime.Version(), v.Go)
	require.Equal(t, runtime.GOOS+"/"+runtime.GOARCH, v.Platform)
	require.NotEmpty(t, v.Version)
	require.Equal(t, []string{"afpacket", "afxdp", "igb", "softnic", "virtio"}, v.Drivers)
}

// TestInfoText: info's lines for each link state, and the JSON keys
// scripts read.
func TestInfoText(t *testing.T) {
	in := infoOutput{Address: "0000:00:04.0", Driver: "igb", Model: "Intel 82576", MAC: "52:54:00:12:34:56", MTU: 1500,
		MaxRxFrame: 2036, MaxTxFrame: 1514, Link: infoLink{Up: true, Reported: true, SpeedMbps: 1000, FullDuplex: true},
		QueuePairs: 1, MaxQueuePairs: 4, QueueSize: 256, RxBuffers: 256, BufferSize: 2048, Vectors: 3,
		Features: []string{"advanced-descriptors", "msix"}, Offloads: []string{"tx IPv4/TCP/UDP checksum"}, Rebound: true, PreviousDriver: "igb"}
	var b bytes.Buffer
	printInfo(&b, in)
	for _, want := range []string{
		"0000:00:04.0: Intel 82576 (igb driver)\n",
		"  MAC              52:54:00:12:34:56\n",
		"  MTU              1500 (frames up to 1514 bytes sent, 2036 received into one buffer)\n",
		"  link             up, 1000 Mbit/s full duplex\n",
		"  queue pairs      1 used, 4 offered\n",
		"  rings            256 descriptors; 256 receive buffers of 2048 bytes\n",
		"  MSI-X vectors    3\n",
		"  features         advanced-descriptors msix\n",
		"  offloads         tx IPv4/TCP/UDP checksum\n",
		"  binding          bound to vfio-pci for this look (was igb), given back on exit\n",
	} {
		require.Contains(t, b.String(), want)
	}
	for _, tc := range []struct {
		l    infoLink
		want string
	}{
		{infoLink{Up: true}, "up (the device does not report its link)"},
		{infoLink{Reported: true}, "down"},
		{infoLink{Up: true, Reported: true}, "up"},
		{infoLink{Up: true, Reported: true, SpeedMbps: 10}, "up, 10 Mbit/s half duplex"},
		{infoLink{Error: "boom"}, "unknown: boom"},
	} {
		require.Equal(t, tc.want, linkText(tc.l))
	}
	js, err := json.Marshal(in)
	require.NoError(t, err)
	for _, k := range []string{`"mac":`, `"mtu":`, `"link":{"up":true,"reported":true,"speed_mbps":1000,"full_duplex":true}`,
		`"queue_pairs":1`, `"max_queue_pairs":4`, `"queue_size":256`, `"features":`, `"offloads":`, `"counters":`} {
		require.Contains(t, string(js), k)
	}
}

func TestMissingDevice(t *testing.T) {
	code, _, errw := runCLI("bind", "0000:7f:1f.7")
	require.Equal(t, 1, code)
	require.Contains(t, errw, "0000:7f:1f.7")
	require.Contains(t, errw, "not found")
	code, _, errw = runCLI("probe", "0000:7f:1f.7")
	require.Equal(t, 1, code)
	require.Contains(t, errw, "not found")
}

// TestProbeJSON: even a failed probe prints its JSON object, which says
// what went wrong.
func TestProbeJSON(t *testing.T) {
	code, out, errw := runCLI("probe", "0000:7f:1f.7", "-json")
	require.Equal(t, exitFailure, code)
	var r probeReport
	require.NoError(t, json.Unmarshal([]byte(out), &r), out)
	require.Equal(t, "0000:7f:1f.7", r.Address)
	require.Contains(t, r.Error, "not found")
	require.Contains(t, errw, "not found")
}

// fakeDevice is a nic.Device with fixed counters, for the summaries.
type fakeDevice struct{ stats nic.Stats }

func (f *fakeDevice) Close() error { return nil }
func (f *fakeDevice) Info() nic.Info {
	return nic.Info{Driver: "fake", Address: "0000:7f:1f.0", Model: "fake", MAC: f.MAC(), MTU: 9000,
		QueuePairs: 1, QueueSize: 256, RxBuffers: 512, BufferSize: 9088, Vectors: 3, Features: []string{"MTU"}}
}
func (f *fakeDevice) MAC() net.HardwareAddr                   { return net.HardwareAddr{2, 0, 0, 0, 0, 1} }
func (f *fakeDevice) Link() (nic.Link, error)                 { return nic.Link{Up: true}, nil }
func (f *fakeDevice) Stats() nic.Stats                        { return f.stats }
func (f *fakeDevice) QueuePairs() int                         { return 1 }
func (f *fakeDevice) Rx(int) (nic.RxQueue, error)             { return nil, nic.ErrInvalid }
func (f *fakeDevice) Tx(int) (nic.TxQueue, error)             { return nil, nic.ErrInvalid }
func (f *fakeDevice) BindCQ(*cq.CQ, int, nic.Direction) error { return nic.ErrNotSupported }

// TestTrafficSummaryJSON: the -json summary of a traffic command parses
// back with the device's counters and rates in pps and Mbit/s.
func TestTrafficSummaryJSON(t *testing.T) {
	dev := &fakeDevice{stats: nic.Stats{
		Rx: nic.QueueStats{Packets: 1000, Bytes: 1000 * 125, Errors: 2, Interrupts: 7, Notifies: 3},
		Tx: nic.QueueStats{Packets: 10, Bytes: 640, Suppressed: 1}}}
	var human, js bytes.Buffer
	p := newProgress(&human, dev, 0, func() string { return "written 1000" })
	p.start = time.Now().Add(-2 * time.Second)
	p.promisc = true
	c := captureCounts{written: 1000, tooLong: 3, tooLongMax: 9018, bufFrame: 4084}
	require.NoError(t, p.summary("capture", &js, c.details()))
	require.Contains(t, human.String(), "capture: ")
	require.Contains(t, human.String(), "rx 1000 frames (125000 bytes, ")
	require.Contains(t, human.String(), "pps")
	require.Contains(t, human.String(), "Mbit/s")

	var s trafficSummary
	require.NoError(t, json.Unmarshal(js.Bytes(), &s), js.String())
	require.Equal(t, "capture", s.Command)
	require.Equal(t, 9000, s.Device.MTU)
	require.True(t, s.Device.Promiscuous)
	require.EqualValues(t, 1000, s.Rx.Frames)
	require.EqualValues(t, 2, s.Rx.Errors)
	require.EqualValues(t, 7, s.Rx.Interrupts)
	require.InDelta(t, 500, s.Rx.PPS, 10, "about 1000 frames in 2 s")
	require.InDelta(t, 0.5, s.Rx.Mbps, 0.01, "125000 bytes in 2 s")
	require.EqualValues(t, 1000, s.Details["written"])
	tl := s.Details["too_long"].(map[string]any)
	require.EqualValues(t, 3, tl["frames"])
	require.EqualValues(t, 9018, tl["largest_bytes"])
	require.Contains(t, tl["reason"], "longer than the 4084 bytes")
}

// TestCaptureCounts: a frame spread over several buffers is one frame too
// long, with its full length; other error completions are counted apart.
func TestCaptureCounts(t *testing.T) {
	c := captureCounts{bufFrame: 2036}
	for _, e := range []error{
		&nic.MultiBufferError{Buffer: 0, Buffers: 3, Bytes: 2036},
		&nic.MultiBufferError{Buffer: 1, Buffers: 3, Bytes: 2036},
		&nic.MultiBufferError{Buffer: 2, Buffers: 3, Bytes: 100},
		cq.ProvBadID,
		&nic.MultiBufferError{Buffer: 0, Buffers: 2, Bytes: 2036},
		&nic.MultiBufferError{Buffer: 1, Buffers: 2, Bytes: 1},
	} {
		c.failed(e)
	}
	require.EqualValues(t, 2, c.tooLong)
	require.Equal(t, 4172, c.tooLongMax)
	require.EqualValues(t, 1, c.bad)
	require.Contains(t, c.line(), "too long for the 2036-byte buffers 2 (up to 4172 bytes; raise -buffer-size)")
}

// echoServer echoes UDP datagrams on localhost until the test ends.
func echoServer(t *testing.T, reply bool) string {
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	go func() {
		buf := make([]byte, 65536)
		for {
			n, a, err := conn.ReadFromUDP(buf)
			if err != nil {
				return
			}
			if reply {
				_, _ = conn.WriteToUDP(buf[:n], a)
			}
		}
	}()
	return conn.LocalAddr().String()
}

func udppingJSON(t *testing.T, out string) udppingSummary {
	var s udppingSummary
	require.NoError(t, json.Unmarshal([]byte(out), &s), out)
	return s
}

func TestUDPPing(t *testing.T) {
	addr := echoServer(t, true)
	code, out, errw := runCLI("udpping", addr, "-count", "5", "-interval", "1ms", "-size", "3000", "-json")
	require.Equal(t, exitOK, code, errw)
	s := udppingJSON(t, out)
	require.Equal(t, udppingSummary{Server: addr, Size: 3000, Sent: 5, Echoed: 5}, udppingSummary{
		Server: s.Server, Size: s.Size, Sent: s.Sent, Echoed: s.Echoed, Lost: s.Lost, Corrupted: s.Corrupted, Refused: s.Refused})
	require.Contains(t, errw, "udpping: 5 sent, 5 echoed intact, 0 lost, 0 corrupted, 0 refused", "human lines on stderr")
}

// TestUDPPingRefused: a closed port answers with ICMP port unreachable;
// udpping counts the refusals and still prints its summary.
func TestUDPPingRefused(t *testing.T) {
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	addr := conn.LocalAddr().String()
	conn.Close() // nothing listens there now
	code, out, errw := runCLI("udpping", addr, "-count", "4", "-interval", "1ms", "-timeout", "500ms", "-json")
	require.Equal(t, exitFailure, code, errw)
	s := udppingJSON(t, out)
	require.Positive(t, s.Refused)
	require.Zero(t, s.Echoed)
	// A refusal seen by a write is for an earlier datagram, and the
	// datagram of that write was not sent.
	require.Positive(t, s.Sent)
	require.LessOrEqual(t, s.Sent, 4)
	require.LessOrEqual(t, s.Lost+s.Echoed+s.Corrupted, s.Sent)
	require.Contains(t, errw, "port unreachable")
	require.Contains(t, errw, "refused")
	require.Contains(t, errw, "not echoed intact")
}

// TestUDPPingInterrupt: Ctrl-C while waiting for an echo ends the run with
// its summary, and the datagram then in flight is not counted as lost.
func TestUDPPingInterrupt(t *testing.T) {
	addr := echoServer(t, false)
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(300*time.Millisecond, cancel)
	var out, errw bytes.Buffer
	err := runUDPPing(ctx, []string{"-count", "100", "-timeout", "10s", "-json", addr}, stdio{out: &out, err: &errw})
	require.NoError(t, err, errw.String())
	s := udppingJSON(t, out.String())
	require.Equal(t, 1, s.Sent)
	require.Zero(t, s.Lost)
	require.True(t, s.Interrupted)
	require.Equal(t, 1, s.Unanswered)
	require.Less(t, s.Seconds, 5.0, "Ctrl-C ended the wait")
	require.Contains(t, errw.String(), "interrupted (1 awaiting an echo, not counted as lost)")
	require.False(t, errors.Is(err, context.Canceled))
}

// TestNoVMHarness: the operator's binary does not link the qemu package
// (the demo is cmd/vfnic-demo).
func TestNoVMHarness(t *testing.T) {
	goBin, err := exec.LookPath("go") // go test puts its own first in PATH
	require.NoError(t, err)
	out, err := exec.Command(goBin, "list", "-deps", ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "github.com/vfnic/vfnic/nic/virtio\n")
	for _, p := range strings.Split(string(out), "\n") {
		require.NotContains(t, p, "github.com/vfnic/vfnic/qemu", "cmd/vfnic imports the VM harness")
	}
}

// TestPktgenSays: pktgen's first line says which rate it runs at and what
// ends the run.
func TestPktgenSays(t *testing.T) {
	require.Equal(t, "as fast as the NIC takes them", rateNote(0, 64))
	require.Equal(t, "at 10000 pps (5.12 Mbit/s)", rateNote(10000, 64))
	require.Equal(t, "until 5 frames are sent", stopNote(5, 0))
	require.Equal(t, "for 10s", stopNote(0, 10*time.Second))
	require.Equal(t, "until 5 frames are sent or 1s passes, whichever comes first", stopNote(5, time.Second))
}

// TestNegativeDurations: every duration flag of every command, found in
// the command's own help, refuses a negative value as a usage error that
// names the flag, before any device or socket is touched.
func TestNegativeDurations(t *testing.T) {
	// The arguments each command needs besides the flag under test.
	needs := map[string][]string{
		"echo":    {"-ip", "10.0.0.1", "0000:7f:1f.7"},
		"pktgen":  {"0000:7f:1f.7"},
		"sink":    {"0000:7f:1f.7"},
		"capture": {"-w", "/dev/null", "0000:7f:1f.7"},
		"probe":   {"0000:7f:1f.7"},
		"doctor":  {"0000:7f:1f.7"},
		"bind":    {"0000:7f:1f.7"},
		"unbind":  {"0000:7f:1f.7"},
		"udpping": {"192.0.2.1:7"},
	}
	durFlag := regexp.MustCompile(`(?m)^\s+-(\S+) duration\b`)
	found := map[string]bool{}
	for name := range commands {
		if name == "help" || name == "version" {
			continue
		}
		code, help, errw := runCLI("help", name)
		require.Equal(t, exitOK, code, "%s: %s", name, errw)
		for _, m := range durFlag.FindAllStringSubmatch(help, -1) {
			flagName := m[1]
			found[name+" -"+flagName] = true
			for _, v := range []string{"-1s", "-1ns", "-2h30m0s"} {
				args := append([]string{name, "-" + flagName, v}, needs[name]...)
				code, out, errw := runCLI(args...)
				require.Equal(t, exitUsage, code, "%v: %s", args, errw)
				require.Contains(t, errw, fmt.Sprintf("-%s %s is negative", flagName, v), "%v", args)
				require.NotContains(t, errw, "not found", "%v: refused before the device is looked up", args)
				require.Empty(t, out, "%v", args)
			}
		}
	}
	// The test must not pass by finding nothing.
	for _, want := range []string{"udpping -interval", "udpping -timeout", "echo -duration", "echo -progress", "echo -idle",
		"pktgen -duration", "sink -idle", "capture -progress"} {
		require.True(t, found[want], "help lists no duration flag %q (found %v)", want, found)
	}
}
