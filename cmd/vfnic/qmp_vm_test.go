package main

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

// qmpMarker starts a guest output line that asks the host for something
// only QEMU's monitor can do: "VFNIC-QMP <op> <slot> <arg>".
const qmpMarker = "VFNIC-QMP "

// qmpAsk asks the host test's qmpHelper for op on the NIC at slot, with
// an argument; the answer is in the host's log, not the guest's.
func qmpAsk(op string, slot, arg int) { fmt.Printf("\n%s%s %d %d\n", qmpMarker, op, slot, arg) }

// qmpHelper watches the guest's output for qmpMarker lines and serves
// them with QEMU's monitor:
//   - "status <slot> 0": QEMU's state of the virtio NIC's first transmit
//     queue, logged (txQueue).
//   - "stalled <slot> <tx_packets>": the same, for a packed-ring queue
//     whose driver stalled after tx_packets completed frames, checked.
//   - "flap <slot> <ms>": set_link off, ms later on.
type qmpHelper struct {
	mon   *qemu.Monitor
	ctx   context.Context
	nics  []qemu.NIC
	wg    sync.WaitGroup
	order sync.Mutex

	// physRings: the guest's Linux NICs use guest-physical DMA addresses
	// (iommu=pt), so their rings can be read with pmemsave.
	physRings bool

	mu   sync.Mutex
	logs []string
	errs []string
	buf  []byte
}

func (h *qmpHelper) Write(p []byte) (int, error) {
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
		i := strings.Index(l, qmpMarker)
		if i < 0 {
			continue
		}
		f := strings.Fields(l[i+len(qmpMarker):])
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

func (h *qmpHelper) logf(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.logs = append(h.logs, fmt.Sprintf(format, args...))
}

func (h *qmpHelper) errorf(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.errs = append(h.errs, fmt.Sprintf(format, args...))
}

// report logs what was served and fails t with the errors.
func (h *qmpHelper) report(t *testing.T) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, l := range h.logs {
		t.Logf("host (QMP): %s", l)
	}
	for _, e := range h.errs {
		t.Errorf("host (QMP): %s", e)
	}
}

func (h *qmpHelper) serve(op string, slot, arg int) {
	id := ""
	for i, n := range h.nics {
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
	ctx, cancel := context.WithTimeout(h.ctx, 30*time.Second)
	defer cancel()
	switch op {
	case "status", "stalled":
		h.txQueue(ctx, id, op == "stalled", arg)
	case "flap":
		if err := h.mon.SetLink(ctx, id, false); err != nil {
			h.errorf("set_link %s off: %v", id, err)
			return
		}
		time.Sleep(time.Duration(arg) * time.Millisecond)
		if err := h.mon.SetLink(ctx, id, true); err != nil {
			h.errorf("set_link %s on: %v", id, err)
			return
		}
		h.logf("set_link %s off, on %d ms later", id, arg)
	default:
		h.errorf("unknown request %q", op)
	}
}

// pmem reads n bytes of the guest's physical memory at addr.
func (h *qmpHelper) pmem(ctx context.Context, addr uint64, n int) ([]byte, error) {
	f, err := os.CreateTemp("", "vfnic-pmem-")
	if err != nil {
		return nil, err
	}
	f.Close()
	defer os.Remove(f.Name())
	if _, err := h.mon.Execute(ctx, "pmemsave", map[string]any{"val": addr, "size": n, "filename": f.Name()}); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(f.Name())
	if err == nil && len(b) != n {
		err = fmt.Errorf("pmemsave %#x: %d bytes of %d", addr, len(b), n)
	}
	return b, err
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
// left, which must be one Linux cannot reach (see killStall).
func (h *qmpHelper) txQueue(ctx context.Context, id string, stalled bool, txPackets int) {
	path := "/machine/peripheral/" + id + "/virtio-backend"
	ret, err := h.mon.Execute(ctx, "x-query-virtio-queue-status", map[string]any{"path": path, "queue": txQueueNo})
	if err != nil {
		h.errorf("%s: %v", id, err)
		return
	}
	var st virtqStatus
	if err := json.Unmarshal(ret, &st); err != nil || st.Num == 0 {
		h.errorf("%s: %v: %s", id, err, ret)
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
	if !h.physRings {
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
