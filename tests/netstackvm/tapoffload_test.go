package netstackvm

import (
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/netstack"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/virtio"
	"github.com/vfnic/vfnic/qemu"
)

// TestTapOffloads boots one guest whose two virtio-net NICs (split rings)
// are on a tap wire (qemu.Tap: taps with virtio-net headers on a bridge in
// a namespace of the run's own), the backend on which QEMU offers
// virtio-net's checksum offloads, and runs TestTapOffloadsGuest there.
func TestTapOffloads(t *testing.T) {
	if qemu.InGuest() {
		t.Skip("host side: boots the guest that runs TestTapOffloadsGuest")
	}
	qemu.RequireVM(t)
	cfg := qemu.Config{
		NICs: []qemu.NIC{
			{Model: qemu.VirtioNet, Slot: slotVfnic, Net: qemu.Tap("w0"), Bind: qemu.BindVFIO},
			{Model: qemu.VirtioNet, Slot: slotLinux, Net: qemu.Tap("w0"), Bind: qemu.BindLinux, IPv4: linuxIP4},
		},
		Timeout:      4 * time.Minute,
		OneTCGThread: true,
	}
	if os.Getenv("VFNIC_GUEST_VERBOSE") != "" {
		cfg.Output = os.Stderr
	}
	qemu.RunGoTestT(t, cfg, qemu.GoTest{
		Package: "github.com/vfnic/vfnic/tests/netstackvm",
		Run:     "^TestTapOffloadsGuest$",
		Args:    []string{"-test.timeout=210s"},
	})
}

// TestTapOffloadsGuest fetches the 16 MiB body with wget from net/http on
// vfnic+netstack three times, on one device reopened: with the checksum
// offloads on (CSUM and GUEST_CSUM negotiated; the driver's and the
// stack's counters show frames sent with NEEDS_CSUM and received with the
// device's verdict), with them off in nic.Config (not negotiated: the
// counters stay zero) and with them on in the driver but off in the stack
// (the stack checks every checksum, the NEEDS_CSUM frames filled in
// first). Each body's SHA-256 matches, and Linux's TCP finds no checksum
// wrong.
func TestTapOffloadsGuest(t *testing.T) {
	if !qemu.InGuest() {
		t.Skip("needs the guest's NICs: runs inside the QEMU guest booted by TestTapOffloads")
	}
	vf, lx := guestPair(t)
	require.Equal(t, qemu.NetTap, vf.Net.Kind, "the vfnic NIC is on a tap wire")
	ifc := linuxInterface(t, lx.GuestAddr())
	big, bigSum := bigBody()
	addrs := []netip.Prefix{netip.MustParsePrefix(vfnicIP4 + "/24")}

	type phase struct {
		name           string
		devOff         bool // nic.Config turns the offloads off
		stackOff       bool // netstack.Config turns them off
		wantNegotiated bool
	}
	for _, p := range []phase{
		{name: "On", wantNegotiated: true},
		{name: "DeviceOff", devOff: true},
		{name: "StackOff", stackOff: true, wantNegotiated: true},
	} {
		ok := t.Run(p.name, func(t *testing.T) {
			d, err := nic.Open(t.Context(), vf.GuestAddr(), nic.Config{NoRxChecksumOffload: p.devOff, NoTxChecksumOffload: p.devOff})
			require.NoError(t, err)
			defer d.Close()
			vd, isVirtio := d.(*virtio.Device)
			require.True(t, isVirtio, "driver %s", d.Info().Driver)
			feats := d.Info().Features
			t.Logf("features: %v", feats)
			for _, f := range []string{"CSUM", "GUEST_CSUM"} {
				require.Equal(t, p.wantNegotiated, slices.Contains(feats, f), "%s negotiated", f)
			}
			csumErrs := linuxTCPCsumErrors(t)
			capt := newCapture(256)
			n, err := netstack.New(d, netstack.Config{Addrs: addrs, NoRxChecksumOffload: p.stackOff, NoTxChecksumOffload: p.stackOff,
				Capture: capt, CaptureSnapLen: 96})
			require.NoError(t, err)
			defer n.Close()
			o := n.Offloads()
			rxo, txo := o.RxChecksum, o.TxChecksum
			want := p.wantNegotiated && !p.stackOff
			require.Equal(t, [2]bool{want, want}, [2]bool{rxo, txo}, "the stack's checksum offloads (receive, transmit)")
			l, err := n.Listen("tcp", ":80")
			require.NoError(t, err)
			go func() {
				_ = http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Length", fmt.Sprint(len(big)))
					_, _ = w.Write(big)
				}))
			}()
			dg := &diag{n: n, dev: d, cap: capt, ifc: ifc}
			start := time.Now()
			sum := dg.wget(t, "http://"+vfnicIP4+"/big")
			require.Equal(t, bigSum, strings.Fields(sum)[0], "SHA-256 of the body wget fetched")
			st, ds := n.Stats(), vd.OffloadStats()
			t.Logf("%s: 16 MiB in %v; stack: %d frames received, %d with the device's verdict (%d bad), %d sent, %d with the device's checksum; "+
				"driver: %d received DATA_VALID, %d received NEEDS_CSUM, %d sent NEEDS_CSUM",
				p.name, time.Since(start).Round(time.Millisecond), st.RxFrames, st.RxChecksumDevice, st.RxChecksumBad, st.TxFrames, st.TxChecksumDevice,
				ds.RxDataValid, ds.RxNeedsCsum, ds.TxNeedsCsum)
			switch {
			case want:
				require.NotZero(t, st.TxChecksumDevice, "frames the device checksummed")
				require.Equal(t, st.TxChecksumDevice, ds.TxNeedsCsum, "each sent with NEEDS_CSUM")
				require.NotZero(t, st.RxChecksumDevice, "frames delivered with the device's verdict")
				require.NotZero(t, ds.RxDataValid+ds.RxNeedsCsum, "frames received DATA_VALID or NEEDS_CSUM")
				require.Zero(t, st.RxChecksumBad)
			case p.wantNegotiated: // the stack's off, the device's on
				require.Zero(t, st.RxChecksumDevice+st.TxChecksumDevice, "the stack used no offload")
				require.Zero(t, ds.TxNeedsCsum, "frames sent with NEEDS_CSUM")
				require.NotZero(t, ds.RxNeedsCsum, "partial frames received (filled in for the stack)")
			default:
				require.Zero(t, st.RxChecksumDevice+st.TxChecksumDevice, "the stack used no offload")
				require.Equal(t, virtio.OffloadStats{}, ds, "the driver's offload counters")
			}
			require.Zero(t, n.Stack().Stats().TCP.ChecksumErrors.Value(), "TCP checksums the stack found wrong")
			require.Equal(t, csumErrs, linuxTCPCsumErrors(t), "TCP checksums Linux found wrong")
			require.NoError(t, n.Close())
		})
		if !ok {
			t.FailNow()
		}
	}
}

// linuxTCPCsumErrors reads TCP's InCsumErrors from Linux's /proc/net/snmp.
func linuxTCPCsumErrors(t *testing.T) uint64 {
	b, err := os.ReadFile("/proc/net/snmp")
	require.NoError(t, err)
	var names []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "Tcp:" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		i := slices.Index(names, "InCsumErrors")
		require.Positive(t, i, "InCsumErrors in /proc/net/snmp")
		v, err := strconv.ParseUint(f[i], 10, 64)
		require.NoError(t, err)
		return v
	}
	t.Fatal("no Tcp lines in /proc/net/snmp")
	return 0
}
