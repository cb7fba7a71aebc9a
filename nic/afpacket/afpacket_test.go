package afpacket

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	vt "github.com/vfnic/vfnic/internal/vethtest"
	"github.com/vfnic/vfnic/nic"
	"golang.org/x/sys/unix"
)

const (
	trafficFrames = 100_000
	window        = 128 // frames in flight, below the ring's 256
)

func openIn(t testing.TB, ns, name string, cfg nic.Config) *Device {
	t.Helper()
	var dev *Device
	require.NoError(t, vt.In(ns, func() (err error) {
		dev, err = Open(context.Background(), name, cfg)
		return err
	}))
	t.Cleanup(func() { _ = dev.Close() })
	return dev
}

// TestTraffic sends 100,000 frames of 60 to 1514 bytes each way between
// vfnic's end of a veth pair (AF_PACKET, a TPACKET_V2 receive ring) and a
// Linux AF_PACKET socket on the other: every frame arrives once, intact,
// every send completes once.
func TestTraffic(t *testing.T) {
	v := vt.New(t, 1)
	dev := openIn(t, v.A, "vfx0", nic.Config{})
	var p *vt.Peer
	require.NoError(t, vt.In(v.B, func() (err error) { p, err = vt.NewPeer("vfx1"); return err }))
	defer p.Close()
	t.Logf("%s: %v", dev.Info().Model, dev.Info().Features)

	t.Run("send", func(t *testing.T) {
		vt.SendFrames(t, dev.tx[0], dev.MAC(), p, trafficFrames, window)
	})

	t.Run("receive", func(t *testing.T) {
		vt.RecvFrames(t, dev.rx[0], dev.MAC(), p, trafficFrames, window, func(f func() error) error { return vt.In(v.B, f) })
	})
}

// TestIdleAndClose: an SRead on an idle queue uses under 1% of a CPU for
// 10 s (getrusage), and Close leaves no socket or ring mapping.
func TestIdleAndClose(t *testing.T) {
	if testing.Short() {
		t.Skip("10 s idle measurement")
	}
	v := vt.New(t, 1)
	fds := func() int {
		n := 0
		ents, _ := readDir("/proc/self/fd")
		for _, e := range ents {
			if l, err := readlink("/proc/self/fd/" + e); err == nil && len(l) > 7 && l[:7] == "socket:" {
				n++
			}
		}
		return n
	}
	fds0 := fds()
	dev := openIn(t, v.A, "vfx0", nic.Config{})
	for dev.rx[0].PostRecv(nil) == nil {
	}
	ring := uintptr(unsafeAddr(dev.socks[0].ring))
	var ru0, ru1 unix.Rusage
	require.NoError(t, unix.Getrusage(unix.RUSAGE_SELF, &ru0))
	w0 := time.Now()
	_, err := dev.rx[0].SRead(context.Background(), make([]nic.Completion, 8), 1, 10*time.Second)
	wall := time.Since(w0)
	require.NoError(t, unix.Getrusage(unix.RUSAGE_SELF, &ru1))
	require.ErrorIs(t, err, nic.ErrTimeout)
	used := time.Duration(ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano())
	t.Logf("idle SRead %v: %v of CPU (%.3f%%)", wall.Round(time.Millisecond), used, 100*used.Seconds()/wall.Seconds())
	require.Less(t, used.Seconds()/wall.Seconds(), 0.01)

	require.Greater(t, fds(), fds0)
	require.True(t, mapped(t, ring))
	require.NoError(t, dev.Close())
	require.Equal(t, fds0, fds(), "sockets")
	require.False(t, mapped(t, ring), "ring mapping")
	require.ErrorIs(t, dev.rx[0].PostRecv(nil), nic.ErrClosed)
}

// TestOpenErrors: what cannot be opened says why.
func TestOpenErrors(t *testing.T) {
	v := vt.New(t, 1)
	for name, want := range map[string]error{
		"afpacket:vfx9":   ErrNoInterface,
		"afpacket:":       nic.ErrInvalid,
		"afpacket:vfx0@1": nic.ErrInvalid,
	} {
		err := vt.In(v.A, func() error { _, err := nic.Open(context.Background(), name, nic.Config{}); return err })
		require.ErrorIs(t, err, want, name)
	}
	for _, cfg := range []nic.Config{{BufferSize: 1024}, {QueueSize: 1}} {
		err := vt.In(v.A, func() error { _, err := Open(context.Background(), "vfx0", cfg); return err })
		require.ErrorIs(t, err, nic.ErrInvalid, "%+v", cfg)
	}
	err := vt.In(v.A, func() error {
		_, err := Open(context.Background(), "vfx0", nic.Config{QueuePairs: maxPairs + 1})
		return err
	})
	require.ErrorIs(t, err, nic.ErrInvalid)
	dev := openIn(t, v.A, "vfx0", nic.Config{})
	require.ErrorIs(t, dev.BindCQ(nil, 0, nic.Recv), nic.ErrInvalid, "no CQ")
	require.ErrorIs(t, dev.rx[0].Release(0x1234), nic.ErrBadBuffer)
	require.ErrorIs(t, dev.tx[0].Send(make([]byte, 13), nil), nic.ErrFrameSize)
}

// TestVLAN: the kernel takes a received frame's outer VLAN tag out of it
// (tp_vlan_tci, tp_vlan_tpid); the queue puts it back, so that tagged
// frames from the peer (802.1Q, and 802.1ad QinQ whose inner tag stays in
// the frame) arrive as they were sent, untagged ones unchanged.
func TestVLAN(t *testing.T) {
	v := vt.New(t, 1)
	dev := openIn(t, v.A, "vfx0", nic.Config{})
	var p *vt.Peer
	require.NoError(t, vt.In(v.B, func() (err error) { p, err = vt.NewPeer("vfx1"); return err }))
	defer p.Close()
	rx := dev.rx[0]
	for rx.PostRecv(nil) == nil {
	}
	tagged := func(seq uint64, tags ...uint32) []byte {
		f := vt.MakeFrame(make([]byte, 2048), dev.MAC(), p.MAC, seq)
		out := append([]byte(nil), f[:12]...)
		for _, tag := range tags {
			out = binary.BigEndian.AppendUint32(out, tag)
		}
		return append(out, f[12:]...)
	}
	frames := [][]byte{
		tagged(1, 0x8100<<16|3<<13|5),           // 802.1Q, PCP 3, VID 5
		tagged(2),                               // untagged
		tagged(3, 0x88a8<<16|100, 0x8100<<16|7), // QinQ
		tagged(4, 0x8100<<16|0),                 // priority tag, VID 0
		tagged(1454, 0x8100<<16|4094),           // full size: 1514 bytes and the tag
	}
	require.NoError(t, vt.In(v.B, func() error {
		for _, f := range frames {
			if err := p.Send(f); err != nil {
				return err
			}
		}
		return nil
	}))
	comps := make([]nic.Completion, 1)
	for _, want := range frames {
		n, err := rx.SRead(context.Background(), comps, 1, 5*time.Second)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.NoError(t, comps[0].Err)
		require.Equal(t, want, comps[0].Data, "frame of %d bytes", len(want))
		require.Equal(t, len(want), comps[0].Len)
		require.NoError(t, rx.Repost(comps[0].Buf, nil))
	}
}

// TestFanout: with QueuePairs 2 the device's two sockets share the
// interface's frames by flow (PACKET_FANOUT_HASH): 64 UDP flows from the
// peer arrive, each frame once, each flow on one queue only, and both
// queues get some; each queue sends on its own socket.
func TestFanout(t *testing.T) {
	v := vt.New(t, 1)
	dev := openIn(t, v.A, "vfx0", nic.Config{QueuePairs: 2})
	require.Equal(t, 2, dev.QueuePairs())
	require.Contains(t, dev.Info().Features, "fanout-hash")
	var p *vt.Peer
	require.NoError(t, vt.In(v.B, func() (err error) { p, err = vt.NewPeer("vfx1"); return err }))
	defer p.Close()
	for _, rx := range dev.rx {
		for rx.PostRecv(nil) == nil {
		}
	}
	const flows, perFlow = 64, 4
	udp := func(flow, seq int) []byte {
		f := make([]byte, 14+20+8+8)
		copy(f, dev.MAC())
		copy(f[6:], p.MAC)
		binary.BigEndian.PutUint16(f[12:], unix.ETH_P_IP)
		ip := f[14:]
		ip[0], ip[8], ip[9] = 0x45, 64, unix.IPPROTO_UDP
		binary.BigEndian.PutUint16(ip[2:], 20+8+8)
		copy(ip[12:], []byte{10, 9, 0, 2})
		copy(ip[16:], []byte{10, 9, 0, 1})
		binary.BigEndian.PutUint16(ip[20:], uint16(10000+flow)) // source port: the flow
		binary.BigEndian.PutUint16(ip[22:], 7)
		binary.BigEndian.PutUint16(ip[24:], 8+8)
		binary.BigEndian.PutUint32(ip[28:], uint32(flow))
		binary.BigEndian.PutUint32(ip[32:], uint32(seq))
		return f
	}
	require.NoError(t, vt.In(v.B, func() error {
		for seq := range perFlow {
			for flow := range flows {
				if err := p.Send(udp(flow, seq)); err != nil {
					return err
				}
			}
		}
		return nil
	}))
	queueOf := map[int]int{} // flow -> queue
	seen := map[[2]int]bool{}
	perQueue := [2]int{}
	comps := make([]nic.Completion, 64)
	deadline := time.Now().Add(10 * time.Second)
	for len(seen) < flows*perFlow {
		require.True(t, time.Now().Before(deadline), "received %d of %d frames", len(seen), flows*perFlow)
		for i, rx := range dev.rx {
			n := rx.Poll(comps)
			for _, c := range comps[:n] {
				require.NoError(t, c.Err)
				if len(c.Data) == 14+20+8+8 && binary.BigEndian.Uint16(c.Data[12:]) == unix.ETH_P_IP && c.Data[14+9] == unix.IPPROTO_UDP {
					flow, seq := int(binary.BigEndian.Uint32(c.Data[42:])), int(binary.BigEndian.Uint32(c.Data[46:]))
					require.False(t, seen[[2]int{flow, seq}], "flow %d frame %d twice", flow, seq)
					seen[[2]int{flow, seq}] = true
					if q, ok := queueOf[flow]; ok {
						require.Equal(t, q, i, "flow %d on one queue", flow)
					}
					queueOf[flow] = i
					perQueue[i]++
				}
				require.NoError(t, rx.Repost(c.Buf, nil))
			}
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("frames per queue: %v", perQueue)
	require.NotZero(t, perQueue[0], "queue 0 got frames")
	require.NotZero(t, perQueue[1], "queue 1 got frames")

	// Each transmit queue sends on its socket; the peer gets both frames.
	for i, tx := range dev.tx {
		require.NoError(t, tx.Send(vt.MakeFrame(make([]byte, 2048), p.MAC, dev.MAC(), uint64(i)), i))
		require.NoError(t, tx.Flush())
		n, err := tx.SRead(context.Background(), comps, 1, 5*time.Second)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, i, comps[0].Context)
	}
	got := map[uint64]bool{}
	require.NoError(t, vt.In(v.B, func() error {
		b := make([]byte, 4096)
		for len(got) < 2 {
			n, err := p.Recv(b)
			if err != nil {
				return err
			}
			if seq, ok, err := vt.CheckFrame(b[:n], p.MAC, dev.MAC()); ok && err == nil {
				got[seq] = true
			}
		}
		return nil
	}))
}
