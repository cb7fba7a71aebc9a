package netstack

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/softnic"
)

// csumDevice gives a wire device checksum offloads, as nic/igb has them:
// its receive queue reports a verdict per frame, its transmit queue fills
// in TCP and UDP checksums. corruptEvery > 0 flips a payload byte of
// every corruptEvery-th TCP frame received, reported as the device
// would: unchecked (the stack must verify it) or, with badVerdict,
// checked and wrong.
type csumDevice struct {
	*softnic.Device
	rx *csumRx
	tx *csumTx
}

type csumRx struct {
	nic.RxQueue
	corruptEvery int
	badVerdict   bool
	mu           sync.Mutex
	seen         int
	unchecked    map[uintptr]bool // buffers of corrupted frames
	corrupted    atomic.Int64
}

type csumTx struct {
	nic.TxQueue
	buf  []byte
	sent atomic.Int64
}

func newCsumDevice(t *testing.T, d *softnic.Device) *csumDevice {
	rq, err := d.Rx(0)
	require.NoError(t, err)
	tq, err := d.Tx(0)
	require.NoError(t, err)
	return &csumDevice{Device: d, rx: &csumRx{RxQueue: rq, unchecked: map[uintptr]bool{}}, tx: &csumTx{TxQueue: tq, buf: make([]byte, tq.MaxFrame())}}
}

func (d *csumDevice) Rx(i int) (nic.RxQueue, error) {
	if i != 0 {
		return nil, nic.ErrInvalid
	}
	return d.rx, nil
}

func (d *csumDevice) Tx(i int) (nic.TxQueue, error) {
	if i != 0 {
		return nil, nic.ErrInvalid
	}
	return d.tx, nil
}

func (q *csumRx) Poll(out []nic.Completion) int {
	n := q.RxQueue.Poll(out)
	q.mu.Lock()
	defer q.mu.Unlock()
	for i := range out[:n] {
		c := &out[i]
		if c.Err != nil || q.corruptEvery == 0 {
			continue
		}
		// TCP segments with data (UDP's would be lost for good).
		_, seg, off, _, ok := l4(c.Data)
		if !ok || off != 16 || len(seg) <= 40 {
			continue
		}
		if q.seen++; q.seen%q.corruptEvery == 0 {
			seg[len(seg)-1] ^= 0x5a
			q.unchecked[c.Buf] = true
			q.corrupted.Add(1)
		}
	}
	return n
}

func (q *csumRx) ChecksumVerified(buf uintptr) (checked, valid bool, err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.unchecked[buf] {
		delete(q.unchecked, buf)
		if q.badVerdict {
			return true, false, nil
		}
		return false, true, nil
	}
	return true, true, nil
}

func (q *csumTx) SendL4Checksum(frame []byte, ctx any) error {
	b := q.buf[:copy(q.buf, frame)]
	setL4Checksum(b)
	if err := q.TxQueue.Send(b, ctx); err != nil {
		return err
	}
	q.sent.Add(1)
	return nil
}

// newOffloadPair is newPair with checksum offloads on A's device.
func newOffloadPair(t *testing.T, cfgA func(*Config), rx func(*csumRx)) (*pair, *csumDevice) {
	t.Helper()
	devA, devB, err := softnic.Pair(nic.Config{QueueSize: 1024})
	require.NoError(t, err)
	cd := newCsumDevice(t, devA)
	if rx != nil {
		rx(cd.rx)
	}
	ca := Config{Addrs: []netip.Prefix{addrA4, addrA6}}
	if cfgA != nil {
		cfgA(&ca)
	}
	a, err := New(cd, ca)
	require.NoError(t, err)
	b, err := New(devB, Config{Addrs: []netip.Prefix{addrB4, addrB6}})
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, a.Close())
		require.NoError(t, b.Close())
		_ = devA.Close()
		_ = devB.Close()
	})
	return &pair{a: a, b: b, devA: devA, devB: devB}, cd
}

// echoBoth echoes 256 KiB over TCP (IPv4 and IPv6) from A through B and
// back, and UDP datagrams both ways.
func echoBoth(t *testing.T, p *pair) {
	echoTCP(t, p, 256<<10, 60*time.Second)
	pc, err := p.b.ListenPacket("udp", ":9")
	require.NoError(t, err)
	defer pc.Close()
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(buf[:n], from)
		}
	}()
	for _, dst := range []string{"10.9.0.2:9", "[fd00:9::2]:9"} {
		c, err := p.a.Dial("udp", dst)
		require.NoError(t, err)
		require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
		msg := randBytes(t, 1000)
		_, err = c.Write(msg)
		require.NoError(t, err)
		got := make([]byte, 2000)
		n, err := c.Read(got)
		require.NoError(t, err)
		require.Equal(t, msg, got[:n])
		require.NoError(t, c.Close())
	}
}

// TestChecksumOffload: with a device that has checksum offloads, the
// stack leaves TCP and UDP checksums to it and skips verifying those it
// verified; each offload turned off, it does both itself. The peer (B,
// no offloads) verifies every checksum A's device filled in.
func TestChecksumOffload(t *testing.T) {
	for _, c := range []struct {
		name   string
		rx, tx bool
	}{{"both", true, true}, {"rx off", false, true}, {"tx off", true, false}, {"both off", false, false}} {
		t.Run(c.name, func(t *testing.T) {
			p, cd := newOffloadPair(t, func(cfg *Config) {
				cfg.NoRxChecksumOffload, cfg.NoTxChecksumOffload = !c.rx, !c.tx
			}, nil)
			o := p.a.Offloads()
			rx, tx := o.RxChecksum, o.TxChecksum
			require.Equal(t, [2]bool{c.rx, c.tx}, [2]bool{rx, tx}, "offloads in use")
			echoBoth(t, p)
			st := p.a.Stats()
			if c.rx {
				require.NotZero(t, st.RxChecksumDevice, "frames delivered with the device's verdict")
			} else {
				require.Zero(t, st.RxChecksumDevice)
			}
			if c.tx {
				require.NotZero(t, st.TxChecksumDevice)
				require.Equal(t, int64(st.TxChecksumDevice), cd.tx.sent.Load())
			} else {
				require.Zero(t, cd.tx.sent.Load(), "frames the device had to checksum")
			}
			require.Zero(t, p.b.Stack().Stats().TCP.ChecksumErrors.Value(), "B found a TCP checksum wrong")
			require.Zero(t, p.b.Stack().Stats().UDP.ChecksumErrors.Value(), "B found a UDP checksum wrong")
		})
	}
	t.Run("no offloads on the device", func(t *testing.T) {
		p := newPair(t, nil)
		o := p.a.Offloads()
		require.False(t, o.RxChecksum || o.TxChecksum)
	})
}

// TestChecksumOffloadUnverified: frames the device did not verify (or
// found wrong) are verified by the stack while offload is on: corrupted
// ones are dropped and TCP retransmits them, so that the data arrives
// intact.
func TestChecksumOffloadUnverified(t *testing.T) {
	for _, bad := range []bool{false, true} {
		name := "unchecked"
		if bad {
			name = "checked bad"
		}
		t.Run(name, func(t *testing.T) {
			// B sends the data A's device corrupts: A dials B's echo and
			// receives the echo through the corrupting queue.
			p, cd := newOffloadPair(t, nil, func(q *csumRx) { q.corruptEvery, q.badVerdict = 25, bad })
			l, err := p.b.Listen("tcp", ":7")
			require.NoError(t, err)
			defer l.Close()
			echo(l)
			c, err := p.a.Dial("tcp", "10.9.0.2:7")
			require.NoError(t, err)
			roundTrip(t, c, randBytes(t, 256<<10))
			require.NoError(t, c.Close())
			require.NotZero(t, cd.rx.corrupted.Load(), "frames corrupted")
			errs := p.a.Stack().Stats().TCP.ChecksumErrors.Value()
			require.EqualValues(t, cd.rx.corrupted.Load(), errs, "the stack found each corrupted segment's checksum wrong")
			if bad {
				require.EqualValues(t, cd.rx.corrupted.Load(), p.a.Stats().RxChecksumBad)
			}
		})
	}
}

var _ net.Conn = (*TCPConn)(nil)
