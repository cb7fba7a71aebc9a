package igb

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/dma"
	"github.com/vfnic/vfnic/doorbell"
	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/internal/owner"
	qcore "github.com/vfnic/vfnic/nic/internal/queue"
	"github.com/vfnic/vfnic/nic/internal/rxbuf"
	"github.com/vfnic/vfnic/pci"
	"github.com/vfnic/vfnic/vfio"
)

// Frame limits at the 1500-byte MTU the driver programs: transmit
// queues take MTU + nic.FrameOverhead bytes (a full-size frame with two
// VLAN tags), and the device receives as much, plus the FCS it counts in
// RLPML.
const (
	mtu        = 1500
	txMaxFrame = mtu + nic.FrameOverhead
	rxMaxFrame = txMaxFrame + 4
)

// Defaults for the zero Config.
const (
	DefaultQueueSize  = 256
	DefaultBufferSize = 2048
	DefaultIOVAFloor  = 4 << 30
)

// Config is nic.Config plus igb's own choices.
type Config struct {
	nic.Config
	// Moderation is the minimum interval between two interrupts of a
	// queue's vector (EITR); 0 interrupts for every write-back.
	Moderation time.Duration
	// LongFrames accepts frames longer than a receive buffer (RLPML up
	// to 16383 bytes). This driver does not reassemble them: each buffer
	// of such a frame completes with cq.ProvMultiBuffer (cq.ETRUNC). Off, the
	// device takes frames of up to MTU + nic.FrameOverhead bytes (1522: a
	// full-size frame with two VLAN tags, as Linux igb) and drops longer
	// ones.
	LongFrames bool
	// VLANStrip has the device remove 802.1Q tags from received frames
	// (CTRL.VME); the tag is then in RxQueue.Offload.
	VLANStrip bool
	// NoQueueInterrupts gives the queues no MSI-X vector, for programs
	// that read them by polling only (Poll, a cq.CQ read without
	// waiting, lcore cores in Busy mode): their Arm, WaitInterrupt and
	// SRead, and the SRead of a CQ they feed, return ErrNotSupported, and
	// Interrupt is nil. Vector 0 still signals link changes. It lifts the
	// limit the device's MSI-X vectors put on QueuePairs: every queue
	// pair of the MAC (16 on the 82576) instead of one less than the
	// vectors (9 on QEMU's model, which has 10).
	NoQueueInterrupts bool
	// LinkWait is how long Open waits for the link to come up after
	// reset (auto-negotiation takes about 0.5 s on QEMU's model, seconds
	// on copper); 0 means DefaultLinkWait, negative does not wait. Open
	// succeeds with the link down when it does not come up in time.
	LinkWait time.Duration
}

// DefaultLinkWait is how long Open waits for the link by default.
const DefaultLinkWait = 3 * time.Second

// regFile is the control path's register access (BAR0 through VFIO, or a
// fake in tests). Data-path registers (tails, EIMS/EIMC) are doorbell.Reg32
// handles taken from the same window.
type regFile interface {
	read(off uint32) uint32
	write(off, v uint32)
}

// mmio is the register file of a mapped BAR0. Offsets are constants below
// bar0Size, checked against the window when it is mapped.
type mmio struct{ w doorbell.Window }

func (m mmio) read(off uint32) uint32 { v, _ := m.w.Read32(uintptr(off)); return v }
func (m mmio) write(off, v uint32)    { _ = m.w.Write32(uintptr(off), v) }

// Device is an igb NIC driven through VFIO (nic.Device).
type Device struct {
	own *owner.Owner // the hold on the PCI device: its driver, giving it back

	name  string
	mac   *mac
	addr  net.HardwareAddr
	info  nic.Info
	regs  regFile
	win   doorbell.Window
	space *dma.Space

	container *vfio.Container
	vdev      *vfio.Device
	// enableMSIX wires MSI-X vectors to eventfds (vfio, or nothing in
	// tests); nVectors is how many the device has.
	enableMSIX func(fds []int) error
	// busMaster turns the device's bus mastering on or off (vfio, a
	// recorder or nothing in tests).
	busMaster func(on bool) error
	nVectors  int
	vmode     vectorMode
	efds      []*eventfd.FD

	rx []*RxQueue
	tx []*TxQueue

	// core is the lock (Close, BindCQ, register reads of the link), the
	// closed state, the queues as the shared core sees them and the
	// MSI-X wiring.
	core     qcore.Device
	linkIntr atomic.Uint64
	hwTotals HWStats // the statistics registers' totals (HWStats), under core.Mu
}

var _ nic.Device = (*Device)(nil)

func init() {
	_ = nic.Register(nic.Driver{Name: "igb", Match: Match,
		Open: func(ctx context.Context, d pci.Device, cfg nic.Config) (nic.Device, error) {
			return Open(ctx, d.Address.String(), Config{Config: cfg})
		}})
}

// Match reports whether d is a member of the family whose MAC-table row
// has been exercised (the 82576).
func Match(d pci.Device) bool {
	if d.VendorID != intelVendorID {
		return false
	}
	m, ok := lookupMAC(d.DeviceID)
	return ok && m.tested
}

// Open takes the igb device at addr: checks the kernel is not using it
// (unless cfg.Force), binds it to vfio-pci, maps BAR0, and brings the
// device up (see the package documentation). The receive queues start
// empty: post buffers, then Flush.
func Open(ctx context.Context, addr string, cfg Config) (*Device, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", nic.ErrInvalid)
	}
	a, err := pci.ParseAddress(addr)
	if err != nil {
		return nil, err
	}
	name := a.String()
	pd, err := pci.Lookup(a)
	if err != nil {
		return nil, err
	}
	if !Match(pd) {
		return nil, fmt.Errorf("%w: %s is %04x:%04x, not a supported igb device", nic.ErrNoDriver, name, pd.VendorID, pd.DeviceID)
	}
	m, _ := lookupMAC(pd.DeviceID)
	if err := normalize(&cfg); err != nil {
		return nil, fmt.Errorf("igb: open %s: %w", name, err)
	}
	own, err := owner.TakeDevice(ctx, "igb", a, cfg.Config)
	if err != nil {
		return nil, err
	}
	d := &Device{name: name, mac: m, own: own, core: qcore.Device{Name: name}}
	fail := func(err error) (*Device, error) {
		// Whatever was set up is released and the device goes back
		// where it was.
		return nil, d.core.FailOpen(err, d.own, d.space, d.hw)
	}
	if pd, err = pci.Lookup(a); err != nil {
		return fail(err)
	}
	if pd.IOMMUGroup < 0 {
		return fail(fmt.Errorf("%w: %s has no IOMMU group (is the IOMMU on?)", nic.ErrNotSupported, name))
	}
	if err := d.openVFIO(pd.IOMMUGroup, cfg); err != nil {
		return fail(err)
	}
	if err := d.start(ctx, cfg); err != nil {
		return fail(err)
	}
	d.own.Record(&d.info)
	// The kernel's request to have the device back blocks its unbind until
	// the device is closed: close it then, readers seeing ErrRemoved.
	d.own.Watch(d.vdev.Request(), func() { _ = d.close(nic.ErrRemovedClosed) })
	wait := cfg.LinkWait
	if wait == 0 {
		wait = DefaultLinkWait
	}
	if wait > 0 {
		if err := d.WaitLink(ctx, wait); err != nil && !errors.Is(err, nic.ErrTimeout) {
			_ = d.Close()
			return nil, err
		}
	}
	return d, nil
}

// WaitLink waits until STATUS reports the link up, sleeping on the link
// change interrupt (vector 0, ICR.LSC) between reads; ErrTimeout when it
// stays down for timeout.
func (d *Device) WaitLink(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		l, err := d.Link()
		if err != nil {
			return err
		}
		if l.Up {
			return nil
		}
		if !time.Now().Before(deadline) {
			return fmt.Errorf("%w: %s: link down after %v", nic.ErrTimeout, d.name, timeout)
		}
		// The interrupt is a hint: re-read STATUS at least every 100ms.
		next := time.Now().Add(100 * time.Millisecond)
		if next.After(deadline) {
			next = deadline
		}
		n, err := d.efds[0].Wait(ctx, next)
		d.linkIntr.Add(n)
		if err != nil && !errors.Is(err, eventfd.ErrTimeout) {
			if errors.Is(err, eventfd.ErrClosed) {
				return nic.ErrClosed
			}
			return err
		}
	}
}

// openVFIO opens the container, group and device, maps BAR0 and makes
// the DMA space.
func (d *Device) openVFIO(group int, cfg Config) error {
	var err error
	if d.container, err = vfio.OpenContainer(); err != nil {
		return err
	}
	g, err := d.container.OpenGroup(group)
	if err != nil {
		return err
	}
	if d.vdev, err = g.OpenDevice(d.name); err != nil {
		return err
	}
	// A process killed while it drove the device leaves it as it was;
	// no DMA or MSI-X until start has reset it (vfio-pci turns bus
	// mastering off when a device fd is released, and resets the device
	// only when it has a function reset).
	d.busMaster = d.vdev.SetBusMaster
	if err = d.busMaster(false); err != nil {
		return err
	}
	bar, err := d.vdev.MapRegion(0)
	if err != nil {
		return fmt.Errorf("igb: BAR0 of %s: %w", d.name, err)
	}
	mem, err := bar.Slice(0, bar0Size)
	if err != nil {
		return fmt.Errorf("igb: BAR0 of %s is smaller than %#x bytes: %w", d.name, bar0Size, err)
	}
	d.win = doorbell.NewWindow(mem)
	d.regs = mmio{d.win}
	info, err := d.vdev.IRQInfo(vfio.IRQMSIX)
	if err != nil {
		return err
	}
	d.nVectors = info.Count
	d.enableMSIX = d.vdev.EnableMSIX
	if d.space, err = dma.NewVFIOSpace(d.container, cfg.IOVAFloor); err != nil {
		return fmt.Errorf("igb: DMA space of %s: %w", d.name, err)
	}
	return nil
}

// normalize fills in defaults and checks the Config.
func normalize(cfg *Config) error {
	c := &cfg.Config
	if c.QueuePairs == 0 {
		c.QueuePairs = 1
	}
	if c.QueueSize == 0 {
		c.QueueSize = DefaultQueueSize
	}
	if c.BufferSize == 0 {
		c.BufferSize = DefaultBufferSize
	}
	if c.RxBuffers == 0 {
		c.RxBuffers = 2 * c.QueueSize
	}
	if c.IOVAFloor == 0 {
		c.IOVAFloor = DefaultIOVAFloor
	}
	switch {
	case c.QueuePairs < 1 || c.QueuePairs > 16:
		return fmt.Errorf("%w: %d queue pairs", nic.ErrInvalid, c.QueuePairs)
	case c.QueueSize < minRing || c.QueueSize > maxRing:
		return fmt.Errorf("%w: queue size %d (%d to %d)", nic.ErrInvalid, c.QueueSize, minRing, maxRing)
	case c.BufferSize < 2048 || c.BufferSize > 16384:
		// SRRCTL counts the buffer in KiB; 2 KiB holds a 1514-byte frame.
		return fmt.Errorf("%w: buffer size %d (2048 to 16384)", nic.ErrInvalid, c.BufferSize)
	case c.RxBuffers < 1 || c.RxBuffers > 1<<20:
		return fmt.Errorf("%w: %d receive buffers", nic.ErrInvalid, c.RxBuffers)
	case cfg.Moderation < 0 || cfg.Moderation > 8*time.Millisecond:
		return fmt.Errorf("%w: moderation %v (0 to 8ms)", nic.ErrInvalid, cfg.Moderation)
	}
	// Rings are powers of two (the table's ids are positions) and whole
	// 128-byte blocks (RDLEN/TDLEN).
	for c.QueueSize&(c.QueueSize-1) != 0 {
		c.QueueSize &= c.QueueSize - 1
	}
	c.BufferSize &^= 1023
	return nil
}

// vectorMode is how queues get MSI-X vectors; vector 0 always takes link
// and other causes.
type vectorMode uint8

const (
	// perQueue: a vector per queue (1+2i receive, 2+2i transmit) while
	// the device has enough.
	perQueue vectorMode = iota
	// perPair: the receive and transmit queue of pair i share vector
	// 1+i, as Linux igb pairs them, when there are too few for one per
	// queue (QEMU's model has 10 vectors: 4 pairs one way, 9 this way).
	perPair
	// noQueueVectors: polling only (Config.NoQueueInterrupts).
	noQueueVectors
)

// chooseVectors picks the vector mode for pairs queue pairs and returns
// how many vectors it uses.
func (d *Device) chooseVectors(pairs int, polling bool) (vectorMode, int, error) {
	switch {
	case d.nVectors < 1:
		return 0, 0, fmt.Errorf("%w: %s has no MSI-X vector", nic.ErrNotSupported, d.name)
	case polling:
		return noQueueVectors, 1, nil
	case 1+2*pairs <= d.nVectors:
		return perQueue, 1 + 2*pairs, nil
	case 1+pairs <= d.nVectors:
		return perPair, 1 + pairs, nil
	}
	return 0, 0, fmt.Errorf("%w: %s has %d MSI-X vectors: %d queue pairs with interrupts need %d (one per pair and one for link changes), so at most %d; Config.NoQueueInterrupts (polling) takes up to %d",
		nic.ErrNotSupported, d.name, d.nVectors, pairs, 1+pairs, d.nVectors-1, d.mac.queues)
}

// queueVector is the vector of pair i's receive or transmit queue, -1 for
// none.
func (d *Device) queueVector(i int, tx bool) int {
	switch d.vmode {
	case perQueue:
		if tx {
			return 2 + 2*i
		}
		return 1 + 2*i
	case perPair:
		return 1 + i
	}
	return -1
}

// start brings the device up from whatever state it is in: it resets
// it, and only then turns bus mastering on, before any interrupt is wired
// or DMA memory mapped, so that nothing a previous owner left in the
// device (enabled rings, their addresses) can reach memory.
func (d *Device) start(ctx context.Context, cfg Config) error {
	pairs := cfg.QueuePairs
	if pairs > d.mac.queues {
		return fmt.Errorf("%w: %s: %d queue pairs asked, the %s has %d", nic.ErrNotSupported, d.name, pairs, d.mac.name, d.mac.queues)
	}
	mode, need, err := d.chooseVectors(pairs, cfg.NoQueueInterrupts)
	if err != nil {
		return err
	}
	d.vmode = mode
	if err := d.reset(ctx); err != nil {
		return err
	}
	if d.busMaster != nil {
		if err := d.busMaster(true); err != nil {
			return err
		}
	}
	d.clearHWStats()
	d.regs.write(regCTRLEXT, d.regs.read(regCTRLEXT)|ctrlExtDrvLoad)
	if err := d.readMAC(); err != nil {
		return err
	}
	// Link: set link up with speed and duplex from the PHY (not forced),
	// and restart auto-negotiation, as Linux's copper set-up does
	// (igb_copper_link_autoneg); the link comes up when it completes.
	d.regs.write(regCTRL, d.regs.read(regCTRL)&^(ctrlFrcSpd|ctrlFrcDpx)|ctrlSLU)
	bmcr, err := d.phyRead(phyCtrl)
	if err != nil {
		return err
	}
	if err := d.phyWrite(phyCtrl, bmcr|phyAutoNegEn|phyRestartAutoN); err != nil {
		return err
	}
	if err := d.setupInterrupts(pairs, need, cfg.Moderation); err != nil {
		return err
	}
	if err := d.setupQueues(cfg.Config, pairs); err != nil {
		return err
	}
	if cfg.VLANStrip {
		d.regs.write(regCTRL, d.regs.read(regCTRL)|ctrlVME)
	}
	d.setupReceive(cfg.Config, pairs, cfg.LongFrames)
	d.regs.write(regTCTL, tctlEN|tctlPSP|tctlRTLC|15<<tctlCTShift|63<<tctlCOLDSh)
	d.fillInfo(cfg.Config, pairs)
	return nil
}

// stopIO masks every interrupt and stops receive and transmit.
func (d *Device) stopIO() {
	r := d.regs
	r.write(regIMC, ^uint32(0))
	r.write(regEIMC, ^uint32(0))
	r.write(regEIAC, 0)
	r.write(regRCTL, 0)
	r.write(regTCTL, tctlPSP)
	_ = r.read(regSTATUS) // flush the posted writes
}

// reset is the datasheet's reset sequence (4.6.1 / Linux
// igb_reset_hw_82575): stop I/O, CTRL.RST, wait for it to clear, then
// mask and clear interrupts again (reset restores their defaults).
func (d *Device) reset(ctx context.Context) error {
	r := d.regs
	d.stopIO()
	time.Sleep(time.Duration(d.mac.rstDelayMs) * time.Millisecond) // pending DMA drains
	r.write(regCTRL, r.read(regCTRL)|ctrlRST)
	time.Sleep(time.Duration(d.mac.rstDelayMs) * time.Millisecond)
	deadline := time.Now().Add(resetTimeout * time.Millisecond)
	for r.read(regCTRL)&ctrlRST != 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %s: CTRL.RST still set after %dms", nic.ErrDeviceFailed, d.name, resetTimeout)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(100 * time.Microsecond)
	}
	r.write(regIMC, ^uint32(0))
	r.write(regEIMC, ^uint32(0))
	_ = r.read(regICR) // read to clear
	_ = r.read(regEICR)
	return nil
}

// mdic runs one MDIC transaction and returns the data read.
func (d *Device) mdic(op uint32, reg, data uint16) (uint16, error) {
	d.regs.write(regMDIC, op|uint32(reg)<<mdicRegShift|phyAddr<<mdicPhyShift|uint32(data))
	for i := 0; i < 1000; i++ {
		v := d.regs.read(regMDIC)
		switch {
		case v&mdicError != 0:
			return 0, fmt.Errorf("%w: %s: MDIC error on PHY register %d", nic.ErrDeviceFailed, d.name, reg)
		case v&mdicReady != 0:
			return uint16(v), nil
		}
		time.Sleep(50 * time.Microsecond)
	}
	return 0, fmt.Errorf("%w: %s: MDIC not ready (PHY register %d)", nic.ErrDeviceFailed, d.name, reg)
}

func (d *Device) phyRead(reg uint16) (uint16, error) { return d.mdic(mdicOpRead, reg, 0) }

func (d *Device) phyWrite(reg, v uint16) error {
	_, err := d.mdic(mdicOpWrite, reg, v)
	return err
}

// readMAC reads receive address 0, which the device loads from its EEPROM
// at reset (datasheet 8.10.13: RAL0/RAH0, AV set).
func (d *Device) readMAC() error {
	lo, hi := d.regs.read(regRAL0), d.regs.read(regRAH0)
	if hi&rahAV == 0 {
		return fmt.Errorf("%w: %s: receive address 0 not valid after reset (RAH0 %#x)", nic.ErrDeviceFailed, d.name, hi)
	}
	m := net.HardwareAddr{byte(lo), byte(lo >> 8), byte(lo >> 16), byte(lo >> 24), byte(hi), byte(hi >> 8)}
	if m[0]&1 != 0 || (lo == 0 && hi&0xffff == 0) {
		return fmt.Errorf("%w: %s: receive address 0 is %v", nic.ErrDeviceFailed, d.name, m)
	}
	d.addr = m
	return nil
}

// setupInterrupts wires need vectors (vfio) and programs the device's
// MSI-X mode: GPIE, an IVAR entry per queue that has a vector, IVAR_MISC
// for link and other causes on vector 0, EITR, EIAC (causes auto-clear),
// EIAM (queue vectors auto-mask, where the device applies it), EIMS for
// vector 0 and IMS.LSC. Queue vectors stay masked until a reader arms
// them.
func (d *Device) setupInterrupts(pairs, need int, moderation time.Duration) error {
	fds := make([]int, need)
	for i := range fds {
		e, err := eventfd.New()
		if err != nil {
			return fmt.Errorf("igb: eventfd for %s: %w", d.name, err)
		}
		d.efds = append(d.efds, e)
		fds[i] = e.Fd()
	}
	d.core.Name, d.core.FDs, d.core.Enable = d.name, fds, d.enableMSIX
	if d.enableMSIX != nil {
		if err := d.enableMSIX(fds); err != nil {
			return err
		}
	}
	r := d.regs
	r.write(regGPIE, gpieNSICR|gpieMSIXMode|gpieEIAME|gpiePBA)
	for i := 0; i < pairs && d.vmode != noQueueVectors; i++ {
		d.setIVAR(i, false, d.queueVector(i, false))
		d.setIVAR(i, true, d.queueVector(i, true))
	}
	r.write(regIVARMISC, (0|ivarValid)<<8)
	itr := eitrValue(moderation)
	queueMask := uint32(0)
	for v := 0; v < need; v++ {
		r.write(regEITR0+4*uint32(v), itr)
		if v > 0 {
			queueMask |= 1 << v
		}
	}
	// Vector 0 auto-clears its EICR bit too (as Linux igb's EIAC holds
	// eims_other): the device raises an MSI-X message only for a cause
	// bit that newly rises in EICR&EIMS (QEMU's igb_raise_interrupts), so
	// a bit left set after the first link change would silence every
	// later one. It stays out of EIAM: nothing would unmask it again.
	r.write(regEIAC, queueMask|1)
	r.write(regEIAM, queueMask)
	r.write(regEIMS, 1) // vector 0: link changes
	r.write(regIMS, icrLSC)
	return nil
}

// eitrValue converts an interval to EITR: bits 2-14 hold the interval in
// units of about 0.25us as Linux igb writes it (196 for 50us), and
// CNT_IGNR keeps the write from resetting the running counter.
func eitrValue(iv time.Duration) uint32 {
	if iv <= 0 {
		return 0
	}
	v := uint32(iv.Nanoseconds()*4/1000) & eitrIntervalMask
	if v == 0 {
		v = 4
	}
	return v | eitrCntIgnr
}

// setIVAR points queue q's receive or transmit cause at vector v.
func (d *Device) setIVAR(q int, tx bool, v int) {
	reg, shift := d.mac.ivar.ivarSlot(q, tx)
	off := regIVAR0 + 4*uint32(reg)
	val := d.regs.read(off)
	val &^= 0xff << shift
	val |= uint32(v|ivarValid) << shift
	d.regs.write(off, val)
}

// setupQueues allocates the rings and buffers in one DMA region and
// programs every queue (datasheet 4.6.7 and 4.6.8).
func (d *Device) setupQueues(cfg nic.Config, pairs int) error {
	n := cfg.QueueSize
	txBuf := align(txMaxFrame, 64)
	ringBytes := align(n*descSize, ringAlign)
	total := pairs * (2*(ringBytes+ringAlign) + cfg.RxBuffers*cfg.BufferSize + 64 + n*txBuf + 64)
	region, err := d.space.Alloc(total, cfg.Memory)
	if err != nil {
		return fmt.Errorf("igb: %d bytes of DMA memory for %s: %w", total, d.name, err)
	}
	r := d.regs
	for i := 0; i < pairs; i++ {
		rq := &RxQueue{}
		rxIOVA, err := d.newQueue(&rq.queue, region, i, n, false)
		if err != nil {
			return err
		}
		pool, err := dma.NewPool(region, cfg.RxBuffers, cfg.BufferSize)
		if err != nil {
			return fmt.Errorf("igb: receive buffers of %s: %w", d.name, err)
		}
		rq.bufs, rq.bufLen = rxbuf.New(pool, 0), uint32(cfg.BufferSize)
		rq.Queue.Init(ops{&rq.queue}, n, &rq.bufs)
		rq.Rx = qcore.NewRx(&rq.Queue, ops{&rq.queue}, cfg.BufferSize)
		rq.meta = make([]rxMeta, pool.Cap())
		rq.rss = pairs > 1
		rq.noCsum = cfg.NoRxChecksumOffload
		d.rx = append(d.rx, rq)
		d.core.Rx = append(d.core.Rx, &rq.Queue)

		r.write(rxReg(regRXDCTL0, i), 0)
		r.write(rxReg(regRDBAL0, i), uint32(rxIOVA))
		r.write(rxReg(regRDBAH0, i), uint32(rxIOVA>>32))
		r.write(rxReg(regRDLEN0, i), uint32(n*descSize))
		r.write(rxReg(regSRRCTL0, i), uint32(cfg.BufferSize>>10)|srrctlDescAdvOne|srrctlDropEn)
		r.write(rxReg(regRDH0, i), 0)
		r.write(rxReg(regRDT0, i), 0)
		if err := d.enableQueue(rxReg(regRXDCTL0, i), 8|8<<8|1<<16); err != nil {
			return err
		}

		tq := &TxQueue{maxFrame: txMaxFrame}
		txIOVA, err := d.newQueue(&tq.queue, region, i, n, true)
		if err != nil {
			return err
		}
		tpool, err := dma.NewPool(region, n, txBuf)
		if err != nil {
			return fmt.Errorf("igb: transmit buffers of %s: %w", d.name, err)
		}
		tq.pool = tpool
		tq.noCsum = cfg.NoTxChecksumOffload
		tq.Queue.Init(ops{&tq.queue}, n, nil)
		d.tx = append(d.tx, tq)
		d.core.Tx = append(d.core.Tx, &tq.Queue)

		r.write(txReg(regTXDCTL0, i), 0)
		r.write(txReg(regTDBAL0, i), uint32(txIOVA))
		r.write(txReg(regTDBAH0, i), uint32(txIOVA>>32))
		r.write(txReg(regTDLEN0, i), uint32(n*descSize))
		r.write(txReg(regTDH0, i), 0)
		r.write(txReg(regTDT0, i), 0)
		r.write(txReg(regTDWBAL0, i), 0) // no head write-back: DD per descriptor
		if err := d.enableQueue(txReg(regTXDCTL0, i), 8|1<<8|1<<16); err != nil {
			return err
		}
	}
	return nil
}

// enableQueue sets RXDCTL/TXDCTL's enable bit with the thresholds and
// waits for the device to report it (DPDK waits up to 10ms).
func (d *Device) enableQueue(off, thresh uint32) error {
	d.regs.write(off, thresh|dctlEnable)
	for i := 0; i < 100; i++ {
		if d.regs.read(off)&dctlEnable != 0 {
			return nil
		}
		time.Sleep(100 * time.Microsecond)
	}
	return fmt.Errorf("%w: %s: queue control %#x did not enable", nic.ErrDeviceFailed, d.name, off)
}

// newQueue carves queue i's ring into q and makes its reader, doorbell
// and interrupt handles; it returns the ring's IOVA.
func (d *Device) newQueue(q *queue, region *dma.Region, i, n int, tx bool) (uint64, error) {
	mem, err := region.Carve(n*descSize, ringAlign)
	if err != nil {
		return 0, fmt.Errorf("igb: ring of %s: %w", d.name, err)
	}
	rg, err := newRing(mem.Bytes, n, tx)
	if err != nil {
		return 0, err
	}
	kind, tailReg, vec, qnum := "rx", rxReg(regRDT0, i), d.queueVector(i, false), uint32(2*i)
	if tx {
		kind, tailReg, vec, qnum = "tx", txReg(regTDT0, i), d.queueVector(i, true), uint32(2*i+1)
	}
	tail, err := d.win.Reg32(uintptr(tailReg))
	if err != nil {
		return 0, err
	}
	q.Name, q.Pair, q.QNum, q.Driver, q.rx, q.n = fmt.Sprintf("%s%d", kind, i), i, qnum, "igb", !tx, uint32(n)
	q.NoIRQHint = " (NoQueueInterrupts: read it by polling)"
	q.desc, q.r, q.db = mem.Bytes, rg, doorbell.NewDoorbell(tail)
	q.Vector, q.VDev = vec, d.vdev
	if vec < 0 {
		return mem.IOVA, nil // polling only: no vector, no eventfd
	}
	if q.eims, err = d.win.Reg32(regEIMS); err != nil {
		return 0, err
	}
	if q.eimc, err = d.win.Reg32(regEIMC); err != nil {
		return 0, err
	}
	if q.eicr, err = d.win.Reg32(regEICR); err != nil {
		return 0, err
	}
	q.vbit, q.EFD = 1<<vec, d.efds[vec]
	if d.vmode == perPair {
		// The pair's receive queue is made first and makes the vector
		// both share.
		q.slot = slotRx
		if tx {
			q.slot, q.shared = slotTx, d.rx[i].shared
		} else {
			q.shared = &sharedVec{bit: q.vbit, efd: q.EFD, eims: q.eims, eimc: q.eimc, eicr: q.eicr}
		}
		q.OnTook = q.tookShared
	}
	if tx {
		q.silent = make([]bool, n)
	}
	return mem.IOVA, nil
}

// setupReceive programs the receive filters and offloads, then RCTL:
// broadcast accept, CRC strip, promiscuous when asked, and the length
// limit (RCTL.LPE with RLPML: tagged full-size frames, or LongFrames).
// With several queue pairs, RSS spreads flows (MRQC, RETA, key;
// RXCSUM.PCSD so the descriptor carries the hash rather than the
// fragment checksum).
func (d *Device) setupReceive(cfg nic.Config, pairs int, long bool) {
	r := d.regs
	csum := uint32(rxcsumIPOFL | rxcsumTUOFL)
	if pairs > 1 {
		csum |= rxcsumPCSD
		for i := 0; i < 10; i++ {
			k := rssKey[4*i:]
			r.write(regRSSRK0+4*uint32(i), uint32(k[0])|uint32(k[1])<<8|uint32(k[2])<<16|uint32(k[3])<<24)
		}
		for i := 0; i < 32; i++ {
			var v uint32
			for j := 0; j < 4; j++ {
				v |= uint32((4*i+j)%pairs) << (8 * j)
			}
			r.write(regRETA0+4*uint32(i), v)
		}
		r.write(regMRQC, mrqcRSS|mrqcIPv4|mrqcIPv4TCP|mrqcIPv4UDP|mrqcIPv6|mrqcIPv6TCP|mrqcIPv6UDP)
	} else {
		r.write(regMRQC, 0)
	}
	r.write(regRXCSUM, csum)
	rctl := uint32(rctlEN | rctlBAM | rctlSECRC | rctlMPE)
	if cfg.Promiscuous {
		rctl |= rctlUPE
	}
	// Without LPE the device takes 1514 bytes plus one 802.1Q tag and
	// drops a double-tagged full-size frame; with it, RLPML is the limit
	// (FCS included), which Linux igb sets to MTU + 14 + 4 + 2*4.
	rlpml := uint32(rxMaxFrame)
	if long {
		rlpml = 16383
	}
	r.write(regRLPML, rlpml)
	rctl |= rctlLPE
	r.write(regRCTL, rctl)
}

func (d *Device) fillInfo(cfg nic.Config, pairs int) {
	feats := []string{"advanced-descriptors", "msix"}
	if pairs > 1 {
		feats = append(feats, "rss")
	}
	switch d.vmode {
	case perPair:
		feats = append(feats, "vector-per-pair")
	case noQueueVectors:
		feats = append(feats, "no-queue-interrupts")
	}
	d.info = nic.Info{
		Driver: "igb", Address: d.name, Model: "Intel " + d.mac.name, MAC: d.addr, MTU: mtu,
		QueuePairs: pairs, MaxQueuePairs: d.maxPairs(),
		QueueSize: cfg.QueueSize, RxBuffers: cfg.RxBuffers, BufferSize: cfg.BufferSize,
		Vectors: len(d.efds), Features: feats,
	}
}

// maxPairs is how many queue pairs the device takes in the mode it runs
// in: the MAC's queues when polling, else what its vectors allow with one
// per pair.
func (d *Device) maxPairs() int {
	if d.vmode == noQueueVectors {
		return d.mac.queues
	}
	return min(d.mac.queues, d.nVectors-1)
}

// Info implements nic.Device.
func (d *Device) Info() nic.Info { return qcore.Info(d.info, d.addr) }

// MAC implements nic.Device.
func (d *Device) MAC() net.HardwareAddr { return append(net.HardwareAddr(nil), d.addr...) }

// QueuePairs implements nic.Device.
func (d *Device) QueuePairs() int { return len(d.rx) }

// Rx implements nic.Device.
func (d *Device) Rx(i int) (nic.RxQueue, error) { return qcore.RxAt(d.rx, i, d.name) }

// Tx implements nic.Device.
func (d *Device) Tx(i int) (nic.TxQueue, error) { return qcore.TxAt(d.tx, i, d.name) }

// RxQueue returns receive queue i as its concrete type.
func (d *Device) RxQueue(i int) (*RxQueue, error) {
	return qcore.QueueAt(d.rx, i, d.name, "receive")
}

// TxQueue returns transmit queue i as its concrete type.
func (d *Device) TxQueue(i int) (*TxQueue, error) {
	return qcore.QueueAt(d.tx, i, d.name, "transmit")
}

// Link implements nic.Device: STATUS.LU, FD and SPEED.
func (d *Device) Link() (nic.Link, error) {
	d.core.Mu.Lock()
	defer d.core.Mu.Unlock()
	if d.core.Closed {
		return nic.Link{}, nic.ErrClosed
	}
	d.takeLinkInterrupts()
	s := d.regs.read(regSTATUS)
	l := nic.Link{Up: s&statusLU != 0, Reported: true, FullDuplex: s&statusFD != 0}
	switch s & statusSpeedMask {
	case 0:
		l.SpeedMbps = 10
	case statusSpeed100:
		l.SpeedMbps = 100
	default:
		l.SpeedMbps = 1000
	}
	return l, nil
}

// takeLinkInterrupts moves pending vector-0 interrupts to the counter and
// clears the causes (ICR is read-to-clear with GPIE.NSICR), whoever took
// the interrupt: the device raises LSC again only once it has been
// cleared, so a cause left set would silence the next link change.
// Called locked.
func (d *Device) takeLinkInterrupts() {
	if len(d.efds) > 0 {
		if n, _ := d.efds[0].Take(); n > 0 {
			d.linkIntr.Add(n)
		}
		_ = d.regs.read(regICR)
	}
}

// LinkInterrupt is the eventfd that link changes signal (vector 0): one
// interrupt per change of the link. A program that sleeps on it calls Link
// (or Stats, or WaitLink) after each wake-up: reading the link clears the
// device's cause register (ICR), without which it signals no further
// change, as an interrupt handler would. Interrupts the program takes from
// the eventfd itself are not in Stats().ConfigInterrupts.
func (d *Device) LinkInterrupt() *eventfd.FD {
	if len(d.efds) == 0 {
		return nil
	}
	return d.efds[0]
}

// InterruptRegisters is a snapshot of the registers that route, mask and
// auto-clear the device's interrupts (datasheet 7.3), for diagnostics.
type InterruptRegisters struct {
	GPIE     uint32    // general purpose interrupt enable (MSI-X mode, NSICR, EIAME)
	IVAR     [8]uint32 // queue causes to vectors
	IVARMisc uint32    // other causes (link) to a vector, in bits 8-15
	EIMS     uint32    // vectors unmasked
	EIAC     uint32    // vectors whose EICR bit clears when their MSI-X message goes out
	EIAM     uint32    // vectors masked when their message goes out
	IMS      uint32    // other causes enabled (ICR.LSC)
}

// InterruptRegisters reads the interrupt routing registers. It reads none
// of the read-to-clear cause registers (ICR, EICR), so it changes nothing.
func (d *Device) InterruptRegisters() (InterruptRegisters, error) {
	d.core.Mu.Lock()
	defer d.core.Mu.Unlock()
	if d.core.Closed {
		return InterruptRegisters{}, nic.ErrClosed
	}
	r := d.regs
	ir := InterruptRegisters{GPIE: r.read(regGPIE), IVARMisc: r.read(regIVARMISC), EIMS: r.read(regEIMS),
		EIAC: r.read(regEIAC), EIAM: r.read(regEIAM), IMS: r.read(regIMS)}
	for i := range ir.IVAR {
		ir.IVAR[i] = r.read(regIVAR0 + 4*uint32(i))
	}
	return ir, nil
}

// Stats implements nic.Device.
func (d *Device) Stats() nic.Stats {
	d.core.Mu.Lock()
	if !d.core.Closed {
		d.takeLinkInterrupts()
	}
	d.core.Mu.Unlock()
	return d.core.Stats(d.linkIntr.Load())
}

// BindCQ implements nic.Device. Entry.Queue is 2i for the receive queue
// of pair i and 2i+1 for its transmit queue. When the queues of a pair
// share an MSI-X vector (Info.Features "vector-per-pair"), the vector can
// wake one CQ only: both queues are bound to the same CQ (dir
// nic.Recv|nic.Send), or neither.
func (d *Device) BindCQ(c *cq.CQ, i int, dir nic.Direction) error {
	return d.core.BindCQ(c, i, dir, func(qs []*qcore.Queue) error {
		if d.vmode == perPair && len(qs) == 1 {
			return fmt.Errorf("%w: %s: rx%d and tx%d share MSI-X vector %d, which can wake one CQ: bind both (nic.Recv|nic.Send) to it",
				nic.ErrNotSupported, d.name, i, i, qs[0].Vector)
		}
		return nil
	}, d.unbind)
}

// unbind gives a queue its own completions and interrupt back; a vector
// the queues of a pair share goes back to the pair's eventfd once
// neither feeds the CQ any more.
func (d *Device) unbind(s *qcore.Source) error {
	d.core.Mu.Lock()
	defer d.core.Mu.Unlock()
	q := s.Queue()
	keep := false
	if d.vmode == perPair && !d.core.Closed {
		other := d.core.Tx[q.Pair]
		if other == q {
			other = d.core.Rx[q.Pair]
		}
		keep = other.Bound()
	}
	return d.core.Unbind(s, keep)
}

// Close stops the device and releases everything: it waits for queue
// operations in progress, masks interrupts, stops RX/TX and resets the
// device so it no longer touches the rings, disables MSI-X and bus
// mastering, frees the DMA memory, closes the VFIO objects and the
// eventfds (which wakes blocked readers with ErrClosed) and unbinds the
// CQs queues fed, after giving each a flushed error completion
// (cq.ECANCELED) per operation still outstanding on those queues
// (nic.Device.BindCQ). A device that Open bound to vfio-pci then goes back to
// the driver it had (Info.PreviousDriver) unless Config.KeepBound.
// Idempotent.
func (d *Device) Close() error {
	return d.core.CloseFunction(d.own, d.space, d.hw)
}

// close tears the device down once, queues then failing with why, and
// gives it back to its previous driver.
func (d *Device) close(why error) error { return d.core.Close(why, d.own, d.hw) }

// hw releases the device's resources in the order the device needs: no
// DMA memory is freed while the device may still use it.
func (d *Device) hw() error {
	var errs []error
	if d.regs != nil {
		d.stopIO()
		for i := range d.rx {
			d.regs.write(rxReg(regRXDCTL0, i), 0)
			d.regs.write(txReg(regTXDCTL0, i), 0)
		}
		if d.mac != nil {
			if err := d.reset(context.Background()); err != nil {
				errs = append(errs, err)
			}
		}
		d.regs.write(regCTRLEXT, d.regs.read(regCTRLEXT)&^ctrlExtDrvLoad)
	}
	// The DMA memory stays mapped until Close (qcore's CloseFunction):
	// the kernel may take the device back while a goroutine reads a lent
	// frame.
	errs = append(errs, qcore.ReleaseFunction(d.vdev, d.container, d.space, d.efds))
	return errors.Join(errs...)
}

func align(n, a int) int { return (n + a - 1) &^ (a - 1) }
