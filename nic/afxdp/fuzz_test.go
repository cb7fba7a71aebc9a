package afxdp

import (
	"encoding/binary"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/dma"
	"github.com/vfnic/vfnic/hugepage"
	"github.com/vfnic/vfnic/nic"
	"golang.org/x/sys/unix"
)

// Fuzzing the rings the kernel writes, without a kernel: a pair's queues
// over rings in anonymous memory laid out as the kernel lays them out
// (producer, consumer and flags words, then the entries), the fuzzer
// writing what the kernel would.

const fuzzRing = 8 // entries per ring; 8 receive buffers

// fakeRing is a ring in anonymous memory: producer at 0, consumer at 64,
// flags at 128, entries from 192.
func fakeRing(t testing.TB, n, esz int) ring {
	m, err := unix.Mmap(-1, 0, 192+n*esz, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	require.NoError(t, err)
	p := unsafe.Pointer(&m[0])
	return ring{m: m, prod: (*uint32)(p), cons: (*uint32)(unsafe.Add(p, 64)), flags: (*uint32)(unsafe.Add(p, 128)),
		desc: m[192 : 192+n*esz], n: uint32(n), mask: uint32(n - 1)}
}

// fakePair is a queue pair over fake rings, its receive buffers all
// posted and published, and fuzzRing sends posted.
func fakePair(t testing.TB) (*RxQueue, *TxQueue) {
	x := &xsk{fd: -1, chunk: 2048, shift: 11, space: dma.NewIdentitySpace()}
	var err error
	x.umem, err = x.space.Alloc(2*fuzzRing*x.chunk, hugepage.Options{PageSize: hugepage.Size4K})
	require.NoError(t, err)
	x.mem = x.umem.Bytes()
	x.fill, x.comp = fakeRing(t, fuzzRing, addrSize), fakeRing(t, fuzzRing, addrSize)
	x.rx, x.tx = fakeRing(t, fuzzRing, descSize), fakeRing(t, fuzzRing, descSize)
	t.Cleanup(func() { _ = x.close() })
	rx, err := newRxQueue(x, 0, "fuzz", fuzzRing)
	require.NoError(t, err)
	tx, err := newTxQueue(x, 0, "fuzz", 1514)
	require.NoError(t, err)
	for i := 0; ; i++ {
		if err := rx.PostRecv(i); err != nil {
			require.ErrorIs(t, err, nic.ErrFull)
			break
		}
	}
	require.NoError(t, rx.Flush())
	for i := range fuzzRing {
		require.NoError(t, tx.Send(make([]byte, 60+i), i))
	}
	atomic.StoreUint32(x.tx.flags, 0) // no kick: there is no socket
	require.NoError(t, tx.Flush())
	return rx, tx
}

// kernelWrites writes data over a ring's entries and publishes prod.
func kernelWrites(r *ring, data []byte, prod uint32) {
	copy(r.desc, data)
	atomic.StoreUint32(r.prod, prod)
}

// FuzzRxRing: whatever the kernel writes into the receive ring (each
// descriptor's address, length and options, and the producer index), the
// queue returns completions that are either errors lending nothing or
// frames inside the buffer they name, each buffer lent once, and the
// buffer accounting stays whole.
func FuzzRxRing(f *testing.F) {
	desc := func(addr uint64, length, opts uint32) []byte {
		b := make([]byte, descSize)
		binary.LittleEndian.PutUint64(b, addr)
		binary.LittleEndian.PutUint32(b[8:], length)
		binary.LittleEndian.PutUint32(b[12:], opts)
		return b
	}
	rxChunk := func(b uint64) uint64 { return (fuzzRing + b) << 11 } // receive chunks follow the transmit ones
	cat := func(bs ...[]byte) []byte {
		var o []byte
		for _, b := range bs {
			o = append(o, b...)
		}
		return o
	}
	f.Add(cat(desc(rxChunk(0)+headroom, 60, 0), desc(rxChunk(1)+headroom, 1514, 0)), uint32(2))
	f.Add(desc(rxChunk(3)+headroom+1, 60, 0), uint32(1))                                      // wrong offset
	f.Add(desc(rxChunk(3)+headroom|1<<50, 60, 0), uint32(1))                                  // bits beyond the chunk
	f.Add(desc(rxChunk(2)+headroom, 2048-headroom+1, 0), uint32(1))                           // longer than the buffer
	f.Add(desc(rxChunk(2)+headroom, 13, 0), uint32(1))                                        // shorter than a header
	f.Add(desc(rxChunk(2)+headroom, 60, 1), uint32(1))                                        // XDP_PKT_CONTD
	f.Add(desc(3<<11+headroom, 60, 0), uint32(1))                                             // a transmit chunk
	f.Add(cat(desc(rxChunk(4)+headroom, 60, 0), desc(rxChunk(4)+headroom, 60, 0)), uint32(2)) // twice
	f.Add(desc(rxChunk(0)+headroom, 60, 0), uint32(fuzzRing+1))                               // beyond the buffers given
	f.Fuzz(func(t *testing.T, data []byte, prod uint32) {
		rx, _ := fakePair(t)
		kernelWrites(&rx.x.rx, data, prod)
		comps := make([]nic.Completion, 3)
		lent := map[uintptr]bool{}
		lo := uintptrOf(rx.x.umem.Bytes()) + uintptr(fuzzRing*2048)
		for range 2 * fuzzRing {
			n := rx.Poll(comps)
			for i, c := range comps[:n] {
				if c.Err != nil {
					require.Equal(t, n-1, i, "an error completion is the last")
					require.Nil(t, c.Data)
					require.Zero(t, c.Buf)
					continue
				}
				require.GreaterOrEqual(t, c.Len, nic.MinFrame)
				require.LessOrEqual(t, c.Len, rx.MaxFrame())
				require.Equal(t, c.Len, len(c.Data))
				require.GreaterOrEqual(t, c.Buf, lo)
				require.Equal(t, uintptr(headroom), (c.Buf-lo)%2048, "frame at the headroom")
				require.Less(t, c.Buf, lo+fuzzRing*2048)
				require.Equal(t, c.Buf, uintptr(unsafe.Pointer(&c.Data[0])), "Data is the frame at Buf")
				require.False(t, lent[c.Buf], "buffer lent twice")
				lent[c.Buf] = true
			}
			// After an error completion the queue may hold completions
			// it read past it, for the next Poll: the accounting is
			// whole again once they are handed out.
			if n == 0 || comps[n-1].Err == nil {
				accounted(t, rx, lent)
			}
			if n == 0 {
				break
			}
		}
		for b := range lent {
			require.NoError(t, rx.Release(b))
		}
	})
}

// accounted checks that the buffers lent are those the reader holds and
// that each other buffer not free is posted.
func accounted(t *testing.T, rx *RxQueue, lent map[uintptr]bool) {
	posted, nlent := rx.bufs.Counts()
	require.Equal(t, len(lent), nlent)
	require.Equal(t, posted, rx.Outstanding())
	require.LessOrEqual(t, posted+nlent, fuzzRing)
}

// FuzzCompletionRing: whatever the kernel writes into the completion
// ring, each send completes at most once, with its own context and
// length, and refused entries are errors.
func FuzzCompletionRing(f *testing.F) {
	addrs := func(as ...uint64) []byte {
		b := make([]byte, 8*len(as))
		for i, a := range as {
			binary.LittleEndian.PutUint64(b[8*i:], a)
		}
		return b
	}
	f.Add(addrs(0, 1<<11, 2<<11), uint32(3))
	f.Add(addrs(5<<11, 5<<11), uint32(2)) // twice
	f.Add(addrs(1<<11+4), uint32(1))      // not a chunk's start
	f.Add(addrs(1<<11|1<<63), uint32(1))  // bits beyond the chunk
	f.Add(addrs(9<<11), uint32(1))        // a receive chunk
	f.Add(addrs(0), uint32(fuzzRing+1))   // beyond the sends published
	f.Add(addrs(0, 1<<11), uint32(1<<31)) // nonsense index
	f.Fuzz(func(t *testing.T, data []byte, prod uint32) {
		_, tx := fakePair(t)
		kernelWrites(&tx.x.comp, data, prod)
		comps := make([]nic.Completion, 3)
		done := map[int]bool{}
		for range 2 * fuzzRing {
			n := tx.Poll(comps)
			for i, c := range comps[:n] {
				if c.Err != nil {
					require.Equal(t, n-1, i, "an error completion is the last")
					if c.Context == nil {
						continue
					}
				}
				ctx := c.Context.(int)
				require.False(t, done[ctx], "send %d completed twice", ctx)
				done[ctx] = true
				if c.Err == nil {
					require.Equal(t, 60+ctx, c.Len)
				}
			}
			require.Equal(t, fuzzRing-len(done), tx.Outstanding())
			if n == 0 {
				break
			}
		}
		_ = cq.ProvBadID
	})
}
