package netstack

import (
	"encoding/binary"
	"io"
	"sync"
	"time"
)

// pcap writes frames to a writer in the pcap file format (microsecond
// timestamps, Ethernet link type), one Write per frame.
type pcap struct {
	mu   sync.Mutex
	w    io.Writer
	snap int
	buf  []byte
	err  error
}

func newPcap(w io.Writer, snap int) *pcap {
	if snap <= 0 {
		snap = 128
	}
	p := &pcap{w: w, snap: snap, buf: make([]byte, 24, 16+snap)}
	binary.LittleEndian.PutUint32(p.buf[0:], 0xa1b2c3d4) // magic: microseconds
	binary.LittleEndian.PutUint16(p.buf[4:], 2)          // version 2.4
	binary.LittleEndian.PutUint16(p.buf[6:], 4)
	binary.LittleEndian.PutUint32(p.buf[16:], uint32(snap))
	binary.LittleEndian.PutUint32(p.buf[20:], 1) // LINKTYPE_ETHERNET
	_, p.err = w.Write(p.buf)
	return p
}

// frame records one frame, cut to the snap length.
func (p *pcap) frame(b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return
	}
	now := time.Now()
	n := min(len(b), p.snap)
	p.buf = p.buf[:16+n]
	binary.LittleEndian.PutUint32(p.buf[0:], uint32(now.Unix()))
	binary.LittleEndian.PutUint32(p.buf[4:], uint32(now.Nanosecond()/1000))
	binary.LittleEndian.PutUint32(p.buf[8:], uint32(n))
	binary.LittleEndian.PutUint32(p.buf[12:], uint32(len(b)))
	copy(p.buf[16:], b)
	_, p.err = p.w.Write(p.buf)
}

func (p *pcap) error() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}
