package main

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/softnic"
)

// TestPktgenInPlace: pktgen writes only each frame's head into the
// transmit buffers (SendFunc), relying on them to keep zeros past it.
// Over a software pair whose 64-entry rings each buffer serves many
// times, with sizes growing and shrinking and the addresses, ports and
// VLAN tag of every frame changing, each frame on the wire decodes with
// its own sequence number, length and valid checksums, and zeros after.
func TestPktgenInPlace(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		name, src, dst := "ipv4", "10.0.0.1-10.0.0.9", "10.0.1.1-10.0.1.3"
		if v6 {
			name, src, dst = "ipv6", "2001:db8::1-2001:db8::9", "2001:db8:1::1"
		}
		t.Run(name, func(t *testing.T) {
			w, err := softnic.NewWire("inplace-"+name, softnic.Options{})
			require.NoError(t, err)
			defer w.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			rxDev, err := nic.Open(ctx, "softnic:inplace-"+name+"/1", nic.Config{QueueSize: 1024})
			require.NoError(t, err)
			defer rxDev.Close()
			rx, err := rxDev.Rx(0)
			require.NoError(t, err)
			for rx.PostRecv(nil) == nil {
			}
			require.NoError(t, rx.Flush())

			const frames = 1000
			var out, errw syncBuffer
			require.NoError(t, runPktgen(ctx, []string{"-count", "1000", "-rate", "50000", "-size", "100-1514",
				"-vlan", "5", "-src-ip", src, "-dst-ip", dst, "-src-port", "9000-9006", "-port", "7-8",
				"-queue-size", "64", "-progress", "0", "softnic:inplace-" + name + "/0"}, stdio{out: &out, err: &errw}), errw.String())

			comps := make([]nic.Completion, 64)
			for seq := 0; seq < frames; {
				n, err := rx.SRead(ctx, comps, 1, 5*time.Second)
				require.NoError(t, err, "%d of %d frames", seq, frames)
				for _, c := range comps[:n] {
					require.NoError(t, c.Err)
					checkInPlaceFrame(t, c.Data, seq, v6)
					seq++
					require.NoError(t, rx.Repost(c.Buf, nil))
				}
				require.NoError(t, rx.Flush())
			}
		})
	}
}

func checkInPlaceFrame(t *testing.T, b []byte, seq int, v6 bool) {
	t.Helper()
	require.Len(t, b, 100+seq%1415, "frame %d", seq)
	p := gopacket.NewPacket(b, layers.LayerTypeEthernet, gopacket.Default)
	require.Nil(t, p.ErrorLayer(), "frame %d", seq)
	tag := p.Layer(layers.LayerTypeDot1Q).(*layers.Dot1Q)
	require.EqualValues(t, 5, tag.VLANIdentifier)
	udp := p.Layer(layers.LayerTypeUDP).(*layers.UDP)
	require.EqualValues(t, 9000+seq%7, udp.SrcPort, "frame %d", seq)
	require.EqualValues(t, 7+seq%2, udp.DstPort, "frame %d", seq)
	require.EqualValues(t, seq, binary.BigEndian.Uint64(udp.Payload), "frame %d", seq)
	for i, c := range udp.Payload[8:] {
		require.Zero(t, c, "frame %d: payload byte %d", seq, 8+i)
	}
	if v6 {
		ip := p.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
		require.EqualValues(t, len(ip.Payload), ip.Length)
		require.True(t, udp6Valid(ip, ip.Payload), "frame %d: UDP checksum", seq)
		return
	}
	ip := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	require.EqualValues(t, 0xffff, sum16(ip.Contents, 0), "frame %d: IPv4 header checksum", seq)
	require.EqualValues(t, len(ip.Contents)+len(ip.Payload), ip.Length)
}
