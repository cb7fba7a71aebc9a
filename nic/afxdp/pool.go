package afxdp

import (
	"fmt"

	"github.com/vfnic/vfnic/dma"
	"github.com/vfnic/vfnic/nic"
)

// dmaPool is the pool of n receive buffers from chunk first of x's UMEM:
// the region is carved in chunk order, transmit chunks first.
func dmaPool(x *xsk, first, n int) (*dma.Pool, error) {
	if _, err := x.umem.Carve(first*x.chunk, x.chunk); err != nil { // the transmit chunks
		return nil, fmt.Errorf("%w: afxdp: UMEM: %v", nic.ErrInvalid, err)
	}
	p, err := dma.NewPool(x.umem, n, x.chunk)
	if err != nil {
		return nil, fmt.Errorf("%w: afxdp: UMEM: %v", nic.ErrInvalid, err)
	}
	if off := uintptrOf(p.Buf(0)) - uintptrOf(x.umem.Bytes()); off != uintptr(first*x.chunk) {
		return nil, fmt.Errorf("%w: afxdp: receive buffers at UMEM offset %d, want %d", nic.ErrInvalid, off, first*x.chunk)
	}
	return p, nil
}
