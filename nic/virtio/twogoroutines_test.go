package virtio

import (
	"encoding/binary"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/nic"
)

// TestPostAndPollFromTwoGoroutines: one goroutine posts receive buffers
// and plays the device, another polls and releases, so that the ring
// table's posts and completions come from different goroutines. The
// table is single-threaded (no lock or release store of its own): the
// queue's lock is what orders them, which the race detector checks here
// (go test -race). Every frame arrives once, in order.
func TestPostAndPollFromTwoGoroutines(t *testing.T) {
	const frames = 3000
	forRings(t, func(t *testing.T, packed bool) {
		r := newRig(t, 16, packed, true, 128<<10)
		rx := r.rxQueue(t, 32, 2048, true)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { // the poster and the device
			defer wg.Done()
			sent := 0
			for sent < frames {
				select {
				case <-stop:
					return
				default:
				}
				for rx.PostRecv(nil) == nil {
				}
				if rx.Flush() != nil {
					return
				}
				for sent < frames {
					tk, ok := r.dev.take()
					if !ok {
						break
					}
					b := tk.data(0)
					clear(b[:netHdrLen])
					binary.LittleEndian.PutUint16(b[netHdrNumBuffers:], 1)
					copy(b[netHdrLen:], frameFor(sent, 64))
					r.dev.complete(tk.id, uint32(netHdrLen+64), tk.ndesc)
					sent++
				}
			}
		}()
		defer func() {
			close(stop)
			wg.Wait()
		}()
		var comps [8]nic.Completion
		for got := 0; got < frames; {
			n := rx.Poll(comps[:])
			for _, c := range comps[:n] {
				require.NoError(t, c.Err)
				require.Equal(t, frameFor(got, 64), c.Data, "frame %d", got)
				require.NoError(t, rx.Release(c.Buf))
				got++
			}
		}
	})
}
