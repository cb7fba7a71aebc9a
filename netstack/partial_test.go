package netstack

import (
	"encoding/binary"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/softnic"
)

// partialDevice plays a device whose receive checksum offload may hand
// over frames whose TCP or UDP checksum was never computed (virtio's
// NEEDS_CSUM): its receive queue leaves only the pseudo-header sum in
// each such field and reports the frame checked when its consumer asked
// to keep such frames (KeepPartialChecksums), and completes each itself
// otherwise, as nic/virtio does. offload false plays a device where the
// offload was not negotiated (ChecksumOffload false).
type partialDevice struct {
	*softnic.Device
	rx *partialRx
}

type partialRx struct {
	nic.RxQueue
	offload bool
	keep    atomic.Bool
	mu      sync.Mutex
	partial map[uintptr][]byte // frames lent with a partial checksum
	made    atomic.Int64
	filled  atomic.Int64
}

func (d *partialDevice) Rx(i int) (nic.RxQueue, error) {
	if i != 0 {
		return nil, nic.ErrInvalid
	}
	return d.rx, nil
}

func (q *partialRx) Poll(out []nic.Completion) int {
	n := q.RxQueue.Poll(out)
	q.mu.Lock()
	defer q.mu.Unlock()
	for i := range out[:n] {
		c := &out[i]
		if c.Err != nil {
			continue
		}
		_, seg, off, seed, ok := l4(c.Data)
		if !ok {
			continue
		}
		binary.BigEndian.PutUint16(seg[off:], seed)
		q.made.Add(1)
		if !q.keep.Load() {
			setL4Checksum(c.Data)
			q.filled.Add(1)
			continue
		}
		q.partial[c.Buf] = c.Data
	}
	return n
}

func (q *partialRx) ChecksumVerified(buf uintptr) (checked, valid bool, err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	_, p := q.partial[buf]
	if !p {
		return false, false, nil
	}
	delete(q.partial, buf)
	return true, true, nil
}

func (q *partialRx) KeepPartialChecksums(keep bool) { q.keep.Store(keep) }

func (q *partialRx) ChecksumOffload() bool { return q.offload }

// TestChecksumOffloadPartial: frames whose checksum the device left to
// the receiver are taken as verified with receive offload on (the stack
// asks the driver to keep them), and completed by the driver before the
// stack checks them with it off; a device whose offload
// was not negotiated gives the stack none. TCP and UDP data arrive
// intact each time, and the stack finds no checksum wrong.
func TestChecksumOffloadPartial(t *testing.T) {
	for _, c := range []struct {
		name          string
		offload, noRx bool
	}{{"offload on", true, false}, {"stack's offload off", true, true}, {"device without it", false, false}} {
		t.Run(c.name, func(t *testing.T) {
			devA, devB, err := softnic.Pair(nic.Config{QueueSize: 1024})
			require.NoError(t, err)
			rq, err := devA.Rx(0)
			require.NoError(t, err)
			pd := &partialDevice{Device: devA, rx: &partialRx{RxQueue: rq, offload: c.offload, partial: map[uintptr][]byte{}}}
			a, err := New(pd, Config{Addrs: []netip.Prefix{addrA4, addrA6}, NoRxChecksumOffload: c.noRx})
			require.NoError(t, err)
			b, err := New(devB, Config{Addrs: []netip.Prefix{addrB4, addrB6}})
			require.NoError(t, err)
			p := &pair{a: a, b: b, devA: devA, devB: devB}
			t.Cleanup(func() {
				require.NoError(t, a.Close())
				require.NoError(t, b.Close())
				_ = devA.Close()
				_ = devB.Close()
			})
			rx := a.Offloads().RxChecksum
			require.Equal(t, c.offload && !c.noRx, rx, "receive offload in use")
			if c.offload {
				echoBoth(t, p)
				require.NotZero(t, pd.rx.made.Load(), "frames received with partial checksums")
				if c.noRx {
					require.Equal(t, pd.rx.made.Load(), pd.rx.filled.Load(), "every partial frame filled in")
					require.Zero(t, a.Stats().RxChecksumDevice)
				} else {
					require.Zero(t, pd.rx.filled.Load())
					require.NotZero(t, a.Stats().RxChecksumDevice)
				}
				require.Zero(t, a.Stack().Stats().TCP.ChecksumErrors.Value(), "TCP checksums the stack found wrong")
				require.Zero(t, a.Stack().Stats().UDP.ChecksumErrors.Value(), "UDP checksums the stack found wrong")
			}
		})
	}
}
