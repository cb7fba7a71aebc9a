package main

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/pci"
	"golang.org/x/sys/unix"
)

// addressedAndRouted is eth1 (index 10) with an address and a route
// through a gateway, plus an IPv6 link-local address the kernel makes
// itself.
type addressedAndRouted struct{}

func (addressedAndRouted) Addrs() ([]pci.IfAddr, error) {
	return []pci.IfAddr{{Index: 10, Prefix: netip.MustParsePrefix("10.0.0.2/24")},
		{Index: 10, Prefix: netip.MustParsePrefix("fe80::1/64")}, {Index: 11, Prefix: netip.MustParsePrefix("10.1.0.2/24")}}, nil
}

func (addressedAndRouted) Routes() ([]pci.Route, error) {
	return []pci.Route{{Index: 10, Dst: netip.MustParsePrefix("10.9.0.0/16"), Gateway: netip.MustParseAddr("10.0.0.1")}}, nil
}

// TestSnapshotNet: -force remembers an interface's state, address and
// routes (not what the kernel makes by itself); a NIC without an
// interface has nothing to remember.
func TestSnapshotNet(t *testing.T) {
	f := newFakeMachine(t)
	f.device("0000:7f:01.0", 3, "virtio-pci", "eth1")
	f.device("0000:7f:02.0", 4, pci.VFIODriver)
	sys := f.machine().sys
	s, err := snapshotNet(sys, addressedAndRouted{}, addrs(t, "0000:7f:01.0")[0])
	require.NoError(t, err)
	require.NotNil(t, s)
	require.Len(t, s.ifaces, 1)
	is := s.ifaces[0]
	require.Equal(t, "eth1", is.name)
	require.Equal(t, 10, is.index)
	require.True(t, is.up)
	require.Equal(t, []netip.Prefix{netip.MustParsePrefix("10.0.0.2/24")}, is.addrs)
	require.Len(t, is.routes, 1)

	s, err = snapshotNet(sys, addressedAndRouted{}, addrs(t, "0000:7f:02.0")[0])
	require.NoError(t, err)
	require.Nil(t, s)
}

// TestRtMessages: the rtnetlink requests that give an interface back its
// state are laid out as the kernel reads them.
func TestRtMessages(t *testing.T) {
	b := linkUpMsg(7)
	require.Len(t, b, unix.SizeofIfInfomsg)
	require.EqualValues(t, 7, binary.NativeEndian.Uint32(b[4:8]))
	require.EqualValues(t, unix.IFF_UP, binary.NativeEndian.Uint32(b[8:12]))
	require.EqualValues(t, unix.IFF_UP, binary.NativeEndian.Uint32(b[12:16]))

	b = addrMsg(7, netip.MustParsePrefix("10.0.0.2/24"))
	require.EqualValues(t, unix.AF_INET, b[0])
	require.EqualValues(t, 24, b[1])
	require.EqualValues(t, 7, binary.NativeEndian.Uint32(b[4:8]))
	attrs := b[unix.SizeofIfAddrmsg:]
	require.Equal(t, []byte{8, 0, unix.IFA_LOCAL, 0, 10, 0, 0, 2, 8, 0, unix.IFA_ADDRESS, 0, 10, 0, 0, 2}, attrs)

	b = routeMsg(7, pci.Route{Dst: netip.MustParsePrefix("2001:db8::/32"), Gateway: netip.MustParseAddr("2001:db8::1")})
	require.EqualValues(t, unix.AF_INET6, b[0])
	require.EqualValues(t, 32, b[1])
	require.EqualValues(t, unix.RT_TABLE_MAIN, b[4])
	require.EqualValues(t, unix.RT_SCOPE_UNIVERSE, b[6], "through a gateway")
	require.Len(t, b, unix.SizeofRtMsg+20+20+8, "dst, gateway, oif")
	b = routeMsg(7, pci.Route{Dst: netip.MustParsePrefix("0.0.0.0/0")})
	require.EqualValues(t, unix.RT_SCOPE_LINK, b[6])
	require.Len(t, b, unix.SizeofRtMsg+8, "the default route has no RTA_DST")
}
