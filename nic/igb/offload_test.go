package igb

import (
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/nic"
)

func TestOffload(t *testing.T) {
	d, f := newFakeDevice(t, Config{Config: nic.Config{QueuePairs: 2, QueueSize: 8}})
	dev := newFakeNIC(t, d, f)
	rx := d.rx[0]
	fill(t, rx)
	cases := []struct {
		pktInfo, hash uint32
		status        uint32
		vlan          uint16
		want          RxOffload
	}{
		{PktIPv4 | PktUDP | 1, 0xdeadbeef, rxdStatusIPCS | rxdStatusUDPCS, 0,
			RxOffload{PacketType: PktIPv4 | PktUDP, RSSType: 1, RSSHash: 0xdeadbeef, IPChecksum: ChecksumGood, L4Checksum: ChecksumGood, UDP: true}},
		{PktIPv4 | PktTCP, 0, rxdStatusIPCS | rxdStatusTCPCS | rxdErrL4E | rxdStatusVP, 0x0123,
			RxOffload{PacketType: PktIPv4 | PktTCP, IPChecksum: ChecksumGood, L4Checksum: ChecksumBad, VLANStripped: true, VLAN: 0x0123}},
		{PktIPv4, 0, rxdStatusIPCS | rxdErrIPE, 0,
			RxOffload{PacketType: PktIPv4, IPChecksum: ChecksumBad}},
		{0, 0, 0, 0, RxOffload{}},
	}
	for i, c := range cases {
		p := desc(&rx.queue, uint32(i))
		atomic.StoreUint32((*uint32)(p), c.pktInfo)
		atomic.StoreUint32((*uint32)(unsafe.Add(p, 4)), c.hash)
		atomic.StoreUint32((*uint32)(unsafe.Add(p, 12)), 60|uint32(c.vlan)<<16)
		atomic.StoreUint32((*uint32)(unsafe.Add(p, 8)), c.status|rxdStatusDD|rxdStatusEOP)
	}
	dev.rdh = uint32(len(cases))
	out := make([]nic.Completion, 8)
	require.Equal(t, len(cases), rx.Poll(out))
	for i, c := range cases {
		require.NoError(t, out[i].Err)
		o, err := rx.Offload(out[i].Buf)
		require.NoError(t, err)
		require.Equal(t, c.want, o, "case %d", i)
	}
	// The same verdicts in the basic types netstack reads.
	for i, want := range [][2]bool{{true, true}, {true, false}, {false, false}, {false, true}} {
		checked, valid, err := rx.ChecksumVerified(out[i].Buf)
		require.NoError(t, err)
		require.Equal(t, want, [2]bool{checked, valid}, "case %d: checked, valid", i)
	}
	require.NoError(t, rx.Release(out[0].Buf))
	_, err := rx.Offload(out[0].Buf)
	require.ErrorIs(t, err, nic.ErrBadBuffer, "not lent any more")
}
