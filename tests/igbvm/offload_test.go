package igbvm

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/igb"
)

// TestGuestVLAN has the host send one 802.1Q-tagged data frame and one
// untagged, to a device with VLAN stripping (CTRL.VME) and to one
// without: stripped, the tagged frame arrives without its tag and the
// completion's offload carries the TCI; unstripped, the tag stays in the
// frame and no tag is reported; the untagged frame is the same either way.
func TestGuestVLAN(t *testing.T) {
	guestOnly(t)
	const tci = 5<<13 | 1<<12 | 0x123 // priority 5, DEI, VLAN 0x123
	for _, strip := range []bool{true, false} {
		p := openPeer(t, igb.Config{VLANStrip: strip})
		p.send(p.ctl(msgVLANReq, tci))
		got := map[uint32]bool{}
		deadline := time.Now().Add(10 * time.Second)
		for len(got) < 2 {
			require.True(t, time.Now().Before(deadline), "strip=%v: only %d of the 2 frames in 10s", strip, len(got))
			n, err := p.rx.SRead(t.Context(), p.comps, 1, time.Until(deadline))
			if err != nil {
				require.ErrorIs(t, err, nic.ErrTimeout)
				continue
			}
			for _, c := range p.comps[:n] {
				require.NoError(t, c.Err)
				o, err := p.rx.Offload(c.Buf)
				require.NoError(t, err)
				f := c.Data
				wasTagged := len(f) >= 16 && binary.BigEndian.Uint16(f[12:14]) == 0x8100
				if wasTagged {
					require.Equal(t, uint16(tci), binary.BigEndian.Uint16(f[14:16]), "the tag's TCI")
					f = append(append([]byte(nil), f[:12]...), f[16:]...)
				}
				m, perr := parse(f)
				if m.session != p.session || m.typ != msgData {
					require.NoError(t, p.rx.Repost(c.Buf, nil))
					continue
				}
				require.NoError(t, perr)
				require.True(t, bytes.Equal(dataFrame(p.mac, hostMAC, p.session, m.arg), f), "strip=%v: frame %d intact", strip, m.arg)
				switch {
				case m.arg == 1:
					require.False(t, wasTagged, "frame 1 was sent untagged")
					require.False(t, o.VLANStripped, "strip=%v: untagged frame reported stripped: %+v", strip, o)
				case strip:
					require.False(t, wasTagged, "the device removed the tag")
					require.True(t, o.VLANStripped, "the completion says the tag was stripped: %+v", o)
					require.Equal(t, uint16(tci), o.VLAN, "the stripped TCI")
				default:
					require.True(t, wasTagged, "without CTRL.VME the tag stays in the frame")
					require.False(t, o.VLANStripped, "%+v", o)
				}
				t.Logf("strip=%v: frame %d (%d bytes as received), offload %+v", strip, m.arg, len(c.Data), o)
				got[m.arg] = true
				require.NoError(t, p.rx.Repost(c.Buf, nil))
			}
			require.NoError(t, p.rx.Flush())
		}
		require.NoError(t, p.dev.Close())
	}
}

// TestGuestTxChecksum sends UDP and TCP frames over IPv4 (with and
// without options, tagged and not) and IPv6 with their checksums zeroed
// through SendChecksum: the host receives every one with right checksums
// (gopacket recomputes them), so QEMU's 82576 used the contexts the
// driver wrote.
func TestGuestTxChecksum(t *testing.T) {
	guestOnly(t)
	p := openPeer(t, igb.Config{})
	frames := csumFrames(hostMAC, p.mac, p.session)
	p.send(p.ctl(msgCsumReq, uint32(len(frames))))
	for _, f := range frames {
		sent := append([]byte(nil), f...)
		cs := igb.TxL4
		switch binary.BigEndian.Uint16(sent[12:14]) {
		case 0x0800:
			cs |= igb.TxIPv4
		case 0x8100:
			if binary.BigEndian.Uint16(sent[16:18]) == 0x0800 {
				cs |= igb.TxIPv4
			}
		}
		zeroChecksums(t, sent)
		require.NotEqual(t, f, sent)
		require.NoError(t, p.tx.SendChecksum(sent, nil, cs))
		require.NoError(t, p.tx.Flush())
	}
	p.reclaim()
	var verdict uint32
	p.recv(10*time.Second, func(_ []byte, m msg, _ error) bool {
		verdict = m.arg
		return m.typ == msgCsumDone
	})
	t.Logf("checksum offload: %d frames sent with zero checksums, the host found %d right, %d wrong",
		len(frames), verdict&0xffff, verdict>>16)
	require.Equal(t, uint32(len(frames)), verdict, "every frame arrived with right checksums")
}

// zeroChecksums clears the IPv4 header checksum and the TCP/UDP checksum
// of f in place.
func zeroChecksums(t *testing.T, f []byte) {
	pk := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.NoCopy)
	if ip, ok := pk.Layer(layers.LayerTypeIPv4).(*layers.IPv4); ok {
		off := len(f) - len(ip.Contents) - len(ip.Payload)
		binary.BigEndian.PutUint16(f[off+10:], 0)
	}
	tl := pk.TransportLayer()
	require.NotNil(t, tl)
	off := len(f) - len(tl.LayerContents()) - len(tl.LayerPayload()) + 6
	if _, isTCP := tl.(*layers.TCP); isTCP {
		off += 10
	}
	binary.BigEndian.PutUint16(f[off:], 0)
}
