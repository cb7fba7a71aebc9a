// Package qmpask lets a test running in a guest ask its host for what
// only QEMU's monitor (QMP) can see or do: QEMU's state of a virtio NIC's
// queues and the rings behind them, or a link flap. The guest writes a
// request line on its output (Ask); the host test passes the guest's
// output through a Helper, which serves each request with the Monitor
// and keeps what it found for Report.
package qmpask

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vfnic/vfnic/qemu"
)

// Marker starts a guest output line that asks the host for something
// only QEMU's monitor can do: "VFNIC-QMP <op> <slot> <arg>".
const Marker = "VFNIC-QMP "

// Ask asks the host test's Helper, from the guest, for op on the NIC at
// PCI slot, with an argument; the answer is in the host's log, not the
// guest's. The host serves requests in order while the guest goes on: a
// guest that needs QEMU's view of a state waits a few seconds in it.
func Ask(op string, slot, arg int) { fmt.Printf("\n%s%s %d %d\n", Marker, op, slot, arg) }

// Helper watches the guest's output (it is qemu.Config.Output) for Marker
// lines and serves them with QEMU's monitor:
//   - "status <slot> <queue>": QEMU's state of virtqueue queue of the
//     virtio NIC (x-query-virtio-queue-status), logged; for queue 1, the
//     first transmit queue, also its ring as in "stalled".
//   - "stalled <slot> <tx_packets>": the same for the first transmit
//     queue of a packed-ring NIC whose driver stalled after tx_packets
//     completed frames, checked: QEMU idle with every frame it took
//     completed, and (PhysRings) its device event where the driver cannot
//     reach it.
//   - "flap <slot> <ms>": set_link off, ms later on.
//
// NICs are named as qemu.Config names them: nic<i>, by position.
type Helper struct {
	// Mon is the guest's QEMU monitor (qemu.Config.Monitor).
	Mon *qemu.Monitor
	// Ctx bounds the requests: the host test's context.
	Ctx context.Context
	// NICs are the guest's NICs, as given to qemu.Config.
	NICs []qemu.NIC
	// PhysRings: the guest's Linux NICs use guest-physical DMA addresses
	// (kernel argument iommu=pt), so their rings can be read with
	// pmemsave.
	PhysRings bool
	// Logf, when set, gets every line of the guest's output as it comes.
	Logf func(format string, args ...any)

	wg    sync.WaitGroup
	order sync.Mutex

	mu   sync.Mutex
	logs []string
	errs []string
	buf  []byte
}

// Write implements io.Writer for the guest's output.
func (h *Helper) Write(p []byte) (int, error) {
	h.mu.Lock()
	h.buf = append(h.buf, p...)
	var lines []string
	for {
		i := bytes.IndexByte(h.buf, '\n')
		if i < 0 {
			break
		}
		lines = append(lines, string(h.buf[:i]))
		h.buf = h.buf[i+1:]
	}
	h.mu.Unlock()
	for _, l := range lines {
		if h.Logf != nil {
			h.Logf("guest: %s", l)
		}
		i := strings.Index(l, Marker)
		if i < 0 {
			continue
		}
		f := strings.Fields(l[i+len(Marker):])
		if len(f) != 3 {
			h.errorf("bad request %q", l)
			continue
		}
		slot, err1 := strconv.Atoi(f[1])
		arg, err2 := strconv.Atoi(f[2])
		if err1 != nil || err2 != nil {
			h.errorf("bad request %q", l)
			continue
		}
		// Served in order, without holding up the guest's output.
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			h.serve(f[0], slot, arg)
		}()
	}
	return len(p), nil
}

func (h *Helper) logf(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.logs = append(h.logs, fmt.Sprintf(format, args...))
}

func (h *Helper) errorf(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.errs = append(h.errs, fmt.Sprintf(format, args...))
}

// Wait waits for the requests under way.
func (h *Helper) Wait() { h.wg.Wait() }

// Report waits for the requests under way, logs what was served and
// fails t with the errors.
func (h *Helper) Report(t testing.TB) {
	t.Helper()
	h.Wait()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, l := range h.logs {
		t.Logf("host (QMP): %s", l)
	}
	for _, e := range h.errs {
		t.Errorf("host (QMP): %s", e)
	}
}

func (h *Helper) serve(op string, slot, arg int) {
	id := ""
	for i, n := range h.NICs {
		if n.Slot == slot {
			id = fmt.Sprintf("nic%d", i)
		}
	}
	if id == "" {
		h.errorf("%s: no NIC at slot %d", op, slot)
		return
	}
	h.order.Lock() // one request at a time: the guest waits for each
	defer h.order.Unlock()
	ctx, cancel := context.WithTimeout(h.Ctx, 30*time.Second)
	defer cancel()
	switch op {
	case "status":
		if arg == txQueueNo {
			h.txQueue(ctx, id, false, 0)
		} else if _, ret, err := h.queue(ctx, id, arg); err == nil {
			h.logf("%s queue %d, x-query-virtio-queue-status: %s", id, arg, ret)
		}
	case "stalled":
		h.txQueue(ctx, id, true, arg)
	case "flap":
		if err := h.Mon.SetLink(ctx, id, false); err != nil {
			h.errorf("set_link %s off: %v", id, err)
			return
		}
		time.Sleep(time.Duration(arg) * time.Millisecond)
		if err := h.Mon.SetLink(ctx, id, true); err != nil {
			h.errorf("set_link %s on: %v", id, err)
			return
		}
		h.logf("set_link %s off, on %d ms later", id, arg)
	default:
		h.errorf("unknown request %q", op)
	}
}

// pmem reads n bytes of the guest's physical memory at addr.
func (h *Helper) pmem(ctx context.Context, addr uint64, n int) ([]byte, error) {
	f, err := os.CreateTemp("", "vfnic-pmem-")
	if err != nil {
		return nil, err
	}
	f.Close()
	defer os.Remove(f.Name())
	if _, err := h.Mon.Execute(ctx, "pmemsave", map[string]any{"val": addr, "size": n, "filename": f.Name()}); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(f.Name())
	if err == nil && len(b) != n {
		err = fmt.Errorf("pmemsave %#x: %d bytes of %d", addr, len(b), n)
	}
	return b, err
}

// queue asks QEMU for its state of virtqueue q of NIC id; a failure is
// an error of the Helper's.
func (h *Helper) queue(ctx context.Context, id string, q int) (virtqStatus, json.RawMessage, error) {
	path := "/machine/peripheral/" + id + "/virtio-backend"
	ret, err := h.Mon.Execute(ctx, "x-query-virtio-queue-status", map[string]any{"path": path, "queue": q})
	if err != nil {
		h.errorf("%s: %v", id, err)
		return virtqStatus{}, nil, err
	}
	var st virtqStatus
	if err := json.Unmarshal(ret, &st); err != nil || st.Num == 0 {
		err = fmt.Errorf("%s queue %d: %v: %s", id, q, err, ret)
		h.errorf("%v", err)
		return virtqStatus{}, nil, err
	}
	return st, ret, nil
}

// virtqStatus is what x-query-virtio-queue-status reports of a queue. For
// a packed ring, vring-avail and vring-used are the driver and device
// event suppression areas.
type virtqStatus struct {
	Desc      uint64 `json:"vring-desc"`
	Driver    uint64 `json:"vring-avail"`
	Device    uint64 `json:"vring-used"`
	Num       int    `json:"vring-num"`
	LastAvail int    `json:"last-avail-idx"`
	ShadowIdx int    `json:"shadow-avail-idx"`
	UsedIdx   int    `json:"used-idx"`
	InUse     int    `json:"inuse"`
}

// Packed virtqueue bits (virtio 1.1, 2.7): descriptor flags AVAIL and
// USED, the event suppression flag value DESC and off_wrap's wrap bit.
const (
	pkAvail   = 1 << 7
	pkUsed    = 1 << 15
	pkEvDesc  = 2
	pkEvWrap  = 1 << 15
	txQueueNo = 1 // queue 1: the first transmit queue
)

// txQueue logs QEMU's state of the first transmit queue of the virtio
// NIC id. For a stalled packed ring (stalled, with the driver's count of
// completed frames), it checks what is certain: QEMU holds no frame
// (inuse 0) and has completed all it took (used = last avail = shadow
// avail: it has seen nothing new), which is every frame Linux counts as
// completed. With physRings it also reads the ring: the descriptors the
// driver made available after QEMU's position, and the device event QEMU
// left, which must be one Linux cannot reach: Linux 6.1 kicks only for
// an event inside the batch it has just published.
func (h *Helper) txQueue(ctx context.Context, id string, stalled bool, txPackets int) {
	st, ret, err := h.queue(ctx, id, txQueueNo)
	if err != nil {
		return
	}
	h.logf("%s transmit queue, x-query-virtio-queue-status: %s", id, ret)
	if stalled {
		if st.InUse != 0 || st.UsedIdx != st.LastAvail || st.ShadowIdx != st.LastAvail {
			h.errorf("%s: a stalled queue where QEMU holds frames or has seen more: inuse %d, used %d, last avail %d, shadow avail %d",
				id, st.InUse, st.UsedIdx, st.LastAvail, st.ShadowIdx)
		}
		if txPackets%st.Num != st.LastAvail {
			h.errorf("%s: Linux completed %d frames (%d mod %d), QEMU took up to %d", id, txPackets, txPackets%st.Num, st.Num, st.LastAvail)
		}
	}
	if !h.PhysRings {
		return
	}
	ring, err1 := h.pmem(ctx, st.Desc, st.Num*16)
	drv, err2 := h.pmem(ctx, st.Driver, 4)
	dev, err3 := h.pmem(ctx, st.Device, 4)
	if err := errors.Join(err1, err2, err3); err != nil {
		h.errorf("%s: %v", id, err)
		return
	}
	flags := func(i int) uint16 { return binary.LittleEndian.Uint16(ring[16*((i+st.Num)%st.Num)+14:]) }
	// The device's wrap counter: the last descriptor it used has AVAIL
	// and USED both equal to it.
	devWrap := uint16(0)
	if flags(st.LastAvail-1)&pkUsed != 0 {
		devWrap = 1
	}
	// What the driver made available from the device's position on: in
	// the device's lap, then (past the ring's end) the next.
	pending := 0
	for w, i := devWrap, st.LastAvail; pending < st.Num; pending++ {
		f := flags(i)
		if (f&pkAvail != 0) != (w == 1) || (f&pkUsed != 0) == (w == 1) {
			break
		}
		if i++; i == st.Num {
			i, w = 0, w^1
		}
	}
	evOff, evFlags := binary.LittleEndian.Uint16(dev), binary.LittleEndian.Uint16(dev[2:])
	evIdx, evWrap := int(evOff&^pkEvWrap), evOff>>15
	h.logf("%s transmit ring: device at %d wrap %d; %d descriptors made available after it; device event: flags %d, index %d wrap %d; driver event off_wrap %#04x flags %d",
		id, st.LastAvail, devWrap, pending, evFlags, evIdx, evWrap, binary.LittleEndian.Uint16(drv), binary.LittleEndian.Uint16(drv[2:]))
	if stalled {
		// Linux kicks only when the event lies in the batch it has just
		// published, which starts pending descriptors after the device;
		// with the ring full less pending, an event it cannot reach
		// before that (as one behind the device) is never reached. On
		// the ring's 2*num positions of index and wrap, relative to the
		// device's lap:
		n := st.Num
		pos := func(idx int, wrap uint16) int {
			if wrap != devWrap {
				idx += n
			}
			return idx
		}
		next := pos(st.LastAvail, devWrap) + pending
		ahead := (pos(evIdx, evWrap) - next + 4*n) % (2 * n)
		if pending == 0 || evFlags != pkEvDesc || ahead < n-pending {
			h.errorf("%s: a stalled ring not as explained: %d pending, device event flags %d index %d wrap %d (%d ahead of the driver), device at %d wrap %d",
				id, pending, evFlags, evIdx, evWrap, ahead, st.LastAvail, devWrap)
		}
	}
}
