package virtio

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"math/bits"
	"net"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/vfnic/vfnic/dma"
	"github.com/vfnic/vfnic/doorbell"
	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/internal/owner"
	qcore "github.com/vfnic/vfnic/nic/internal/queue"
	"github.com/vfnic/vfnic/pci"
	"github.com/vfnic/vfnic/vfio"
)

// Defaults for the zero Config.
const (
	DefaultQueueSize  = 256     // descriptors per ring (QEMU's default and maximum)
	DefaultBufferSize = 2048    // bytes per buffer, virtio-net header included
	DefaultIOVAFloor  = 4 << 30 // lowest device address of DMA memory
)

const (
	resetTimeout = time.Second     // for the device to read back status 0
	ctrlTimeout  = 2 * time.Second // for a control command to complete
)

// Config is nic.Config plus virtio's own choices.
type Config struct {
	nic.Config
	// Split uses split rings even when the device offers packed rings.
	Split bool
	// NoEventIdx does not negotiate RING_EVENT_IDX: notifications are then
	// only switched on and off, never aimed at a ring position.
	NoEventIdx bool
	// NoMergeable does not negotiate MRG_RXBUF.
	NoMergeable bool
}

// Device is a virtio-net device driven through VFIO (nic.Device).
type Device struct {
	name     string
	pciDev   pci.Device
	features Features
	packed   bool
	mac      net.HardwareAddr
	mtu      int
	maxPairs int
	info     nic.Info

	container *vfio.Container
	vdev      *vfio.Device
	// busMaster turns the device's bus mastering on or off (vfio, or a
	// recorder in tests).
	busMaster func(on bool) error
	t         *transport
	space     *dma.Space
	cfgEFD    *eventfd.FD
	efds      []*eventfd.FD // the device's eventfds, one per vector, config first
	rx        []*RxQueue
	tx        []*TxQueue
	ctrl      *ctrlQueue

	own *owner.Owner // the hold on the PCI device: its driver, giving it back

	// core is the lock (Close, BindCQ, config-space reads), the closed
	// state, the queues as the shared core sees them and the MSI-X wiring.
	core    qcore.Device
	cfgIntr atomic.Uint64
}

var _ nic.Device = (*Device)(nil)

func init() {
	// The name is unique to this package, so registration cannot fail.
	_ = nic.Register(nic.Driver{Name: "virtio", Match: Match,
		Open: func(ctx context.Context, d pci.Device, cfg nic.Config) (nic.Device, error) {
			return Open(ctx, d.Address.String(), Config{Config: cfg})
		}})
}

// Match reports whether d is a virtio-net device (modern, or transitional
// with a modern interface this driver can use).
func Match(d pci.Device) bool {
	return d.VendorID == pci.VirtioVendorID && (d.DeviceID == pciDeviceNetModern || d.DeviceID == pciDeviceNetTransitional)
}

// Open takes the virtio-net device at addr: it checks the kernel is not
// using it (unless cfg.Force), binds it to vfio-pci, resets it, negotiates
// features (VERSION_1 and ACCESS_PLATFORM are required; RING_PACKED,
// EVENT_IDX, MRG_RXBUF, MAC, STATUS, MTU, CTRL_VQ, CTRL_RX, MQ and the
// checksum offloads CSUM and GUEST_CSUM are taken when offered, unless
// cfg turns them off), sets up the queues in DMA memory with one MSI-X vector
// per queue (vector 0 for configuration changes) and starts the device.
// The receive queues start empty: post buffers, then Flush.
func Open(ctx context.Context, addr string, cfg Config) (*Device, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", nic.ErrInvalid)
	}
	if !littleEndian() {
		return nil, fmt.Errorf("%w: virtio rings are little-endian and this driver stores natively", nic.ErrNotSupported)
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
		return nil, fmt.Errorf("%w: %s is %04x:%04x, not virtio-net", nic.ErrNoDriver, name, pd.VendorID, pd.DeviceID)
	}
	if err := normalize(&cfg); err != nil {
		return nil, fmt.Errorf("virtio: open %s: %w", name, err)
	}
	own, err := owner.TakeDevice(ctx, "virtio", a, cfg.Config)
	if err != nil {
		return nil, err
	}
	d := &Device{name: name, own: own, core: qcore.Device{Name: name}}
	if err := d.open(ctx, a, cfg); err != nil {
		// Whatever was set up is released, the device reset first, and
		// the device goes back where it was.
		return nil, d.core.FailOpen(err, d.own, d.space, d.hw)
	}
	d.own.Record(&d.info)
	// The kernel's request to have the device back blocks its unbind until
	// the device is closed: close it then, readers seeing ErrRemoved.
	d.own.Watch(d.vdev.Request(), func() { _ = d.close(nic.ErrRemovedClosed) })
	return d, nil
}

func (d *Device) open(ctx context.Context, a pci.Address, cfg Config) error {
	pd, err := pci.Lookup(a)
	if err != nil {
		return err
	}
	if pd.IOMMUGroup < 0 {
		return fmt.Errorf("%w: %s has no IOMMU group (is the IOMMU on?)", nic.ErrNotSupported, d.name)
	}
	d.pciDev = pd
	return d.bringUp(ctx, cfg)
}

// bringUp opens the VFIO objects and starts the device.
func (d *Device) bringUp(ctx context.Context, cfg Config) error {
	var err error
	if d.container, err = vfio.OpenContainer(); err != nil {
		return err
	}
	g, err := d.container.OpenGroup(d.pciDev.IOMMUGroup)
	if err != nil {
		return err
	}
	if d.vdev, err = g.OpenDevice(d.name); err != nil {
		return err
	}
	// A process killed while it drove the device leaves its queues
	// enabled at that process's addresses (virtio-net has no function
	// reset for vfio-pci to run at release, which only turns bus
	// mastering off): no DMA or MSI-X until start has reset it.
	d.busMaster = d.vdev.SetBusMaster
	if err = d.busMaster(false); err != nil {
		return err
	}
	if err = d.mapTransport(); err != nil {
		return err
	}
	return d.start(ctx, cfg)
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
	if c.RxBuffers == 0 {
		c.RxBuffers = 2 * c.QueueSize
	}
	if c.IOVAFloor == 0 {
		c.IOVAFloor = DefaultIOVAFloor
	}
	switch {
	case c.QueuePairs < 1 || c.QueuePairs > 0x8000:
		return fmt.Errorf("%w: %d queue pairs", nic.ErrInvalid, c.QueuePairs)
	case c.QueueSize < 2 || c.QueueSize > 1<<15:
		return fmt.Errorf("%w: queue size %d (2 to 32768)", nic.ErrInvalid, c.QueueSize)
	case c.BufferSize != 0 && (c.BufferSize < netHdrLen+nic.MaxFrame || c.BufferSize > 1<<16):
		return fmt.Errorf("%w: buffer size %d (%d to 65536)", nic.ErrInvalid, c.BufferSize, netHdrLen+nic.MaxFrame)
	case c.RxBuffers < 1 || c.RxBuffers > 1<<20:
		return fmt.Errorf("%w: %d receive buffers", nic.ErrInvalid, c.RxBuffers)
	}
	return nil
}

// mapTransport decodes the virtio capabilities and maps their structures.
func (d *Device) mapTransport() error {
	cs, err := pci.ReadConfig(d.vdev.ConfigReader())
	if err != nil {
		return fmt.Errorf("virtio: config space of %s: %w", d.name, err)
	}
	caps, err := cs.VirtioCaps()
	if err != nil {
		return fmt.Errorf("virtio: capabilities of %s: %w", d.name, err)
	}
	bars := map[uint8]*vfio.RegionMapping{}
	d.t, err = newTransport(d.name, caps, func(bar uint8, off, n uint64) ([]byte, error) {
		m, ok := bars[bar]
		if !ok {
			if m, err = d.vdev.MapRegion(int(bar)); err != nil {
				return nil, err
			}
			bars[bar] = m
		}
		return m.Slice(off, n)
	})
	return err
}

// start resets the device and brings it up (3.1.1 of the specification).
// Bus mastering goes on once the reset is complete (status reads 0: the
// device has forgotten every queue), before any interrupt is wired or DMA
// memory mapped, so that nothing a previous owner left can reach memory.
func (d *Device) start(ctx context.Context, cfg Config) error {
	t := d.t
	if err := t.reset(ctx, resetTimeout); err != nil {
		return err
	}
	if err := d.busMaster(true); err != nil {
		return err
	}
	t.setStatus(statusAcknowledge)
	t.setStatus(statusAcknowledge | statusDriver)
	if err := d.negotiate(cfg); err != nil {
		t.setStatus(statusFailed)
		return err
	}
	if err := d.readDeviceConfig(); err != nil {
		return err
	}
	if cfg.BufferSize == 0 {
		// Buffers that hold a tagged MTU-sized frame, so that a jumbo MTU
		// works without the caller sizing anything (within the limit a
		// caller could ask for).
		cfg.BufferSize = min(max(DefaultBufferSize, align(netHdrLen+d.mtu+nic.FrameOverhead, 64)), 1<<16)
	}
	pairs := cfg.QueuePairs
	if pairs > d.maxPairs {
		return fmt.Errorf("%w: %s: %d queue pairs asked, the device offers %d", nic.ErrNotSupported, d.name, pairs, d.maxPairs)
	}
	if err := d.setupInterrupts(pairs); err != nil {
		return err
	}
	if err := d.setupQueues(cfg, pairs); err != nil {
		return err
	}
	t.setStatus(statusAcknowledge | statusDriver | statusFeaturesOK | statusDriverOK)
	if s := t.status(); s&statusDeviceNeedsReset != 0 || s&statusDriverOK == 0 {
		return fmt.Errorf("%w: %s: status %#x after DRIVER_OK", nic.ErrDeviceFailed, d.name, s)
	}
	if err := d.configure(ctx, cfg, pairs); err != nil {
		return err
	}
	d.fillInfo(cfg, pairs)
	return nil
}

// negotiate picks the features and has the device accept them.
func (d *Device) negotiate(cfg Config) error {
	t := d.t
	offered := t.deviceFeatures()
	for _, b := range []int{FeatureVersion1, FeatureAccessPlat} {
		if !offered.Has(b) {
			return fmt.Errorf("%w: %s does not offer %s (offers %v); a device without ACCESS_PLATFORM bypasses the IOMMU",
				nic.ErrNotSupported, d.name, Features(bit(b)), offered)
		}
	}
	want := bit(FeatureVersion1) | bit(FeatureAccessPlat) | bit(FeatureMAC) | bit(FeatureStatus) |
		bit(FeatureMTU) | bit(FeatureSpeedDuplex)
	if !cfg.Split {
		want |= bit(FeatureRingPacked)
	}
	if !cfg.NoEventIdx {
		want |= bit(FeatureEventIdx)
	}
	if !cfg.NoMergeable {
		want |= bit(FeatureMrgRxBuf)
	}
	// Checksum offloads, offered on a backend that carries the header
	// (QEMU's tap); segmentation offloads are not taken (nethdr.go).
	if !cfg.NoTxChecksumOffload {
		want |= bit(FeatureCsum)
	}
	if !cfg.NoRxChecksumOffload {
		want |= bit(FeatureGuestCsum)
	}
	if offered.Has(FeatureCtrlVQ) {
		want |= bit(FeatureCtrlVQ) | bit(FeatureCtrlRx) | bit(FeatureMQ)
	}
	f := offered & want
	t.setDriverFeatures(f)
	t.setStatus(statusAcknowledge | statusDriver | statusFeaturesOK)
	if t.status()&statusFeaturesOK == 0 {
		return fmt.Errorf("%w: %s refused features %v", nic.ErrDeviceFailed, d.name, f)
	}
	d.features = f
	d.packed = f.Has(FeatureRingPacked)
	return nil
}

// readDeviceConfig reads the MAC, MTU and queue pair count.
func (d *Device) readDeviceConfig() error {
	d.mtu, d.maxPairs = 1500, 1
	mac := make(net.HardwareAddr, 6)
	f := d.features
	err := d.t.readConfig(func(w doorbell.Window) error {
		if f.Has(FeatureMAC) {
			for i := range mac {
				v, err := w.Read8(netCfgMAC + uintptr(i))
				if err != nil {
					return err
				}
				mac[i] = v
			}
		}
		if f.Has(FeatureMQ) {
			v, err := w.Read16(netCfgMaxPairs)
			if err != nil {
				return err
			}
			d.maxPairs = int(v)
		}
		if f.Has(FeatureMTU) {
			v, err := w.Read16(netCfgMTU)
			if err != nil {
				return err
			}
			d.mtu = int(v)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if !f.Has(FeatureMAC) {
		// No address from the device: a random locally administered one.
		if _, err := rand.Read(mac); err != nil {
			return fmt.Errorf("virtio: random MAC for %s: %w", d.name, err)
		}
		mac[0] = mac[0]&^1 | 2
	}
	if d.maxPairs < 1 || d.maxPairs > maxQueuePairs {
		return fmt.Errorf("%w: %s reports %d queue pairs", nic.ErrDeviceFailed, d.name, d.maxPairs)
	}
	d.mtu = max(d.mtu, 68) // IPv4's minimum; the buffers are sized from it
	d.mac = mac
	return nil
}

// setupInterrupts wires config changes to vector 0 and queue i of pair p
// (receive 0, transmit 1) to vector 1+2p+i, all in one SET_IRQS call
// (MSI-X cannot be resized while enabled).
func (d *Device) setupInterrupts(pairs int) error {
	info, err := d.vdev.IRQInfo(vfio.IRQMSIX)
	if err != nil {
		return err
	}
	need := 1 + 2*pairs
	if info.Count < need {
		return fmt.Errorf("%w: %s has %d MSI-X vectors, %d queue pairs need %d", nic.ErrNotSupported, d.name, info.Count, pairs, need)
	}
	fds := make([]int, need)
	for i := range fds {
		e, err := eventfd.New()
		if err != nil {
			return fmt.Errorf("virtio: eventfd for %s: %w", d.name, err)
		}
		d.efds = append(d.efds, e)
		fds[i] = e.Fd()
	}
	d.cfgEFD = d.efds[0]
	d.core.FDs, d.core.Enable = fds, d.vdev.EnableMSIX
	if err := d.vdev.EnableMSIX(fds); err != nil {
		return err
	}
	d.t.w16(regConfigMSIXVector, 0)
	if v := d.t.r16(regConfigMSIXVector); v != 0 {
		return fmt.Errorf("%w: %s did not take MSI-X vector 0 for config changes (reads %#x)", nic.ErrDeviceFailed, d.name, v)
	}
	return nil
}

// queueSpec is one virtqueue to set up.
type queueSpec struct {
	name   string
	qidx   uint16
	size   int
	vector uint16
}

// planQueues lists the virtqueues to set up: rx and tx of each pair, and
// the control queue, numbered 2*maxPairs, when ctrl. Each index must be
// one of the device's nq queues; the control queue of a device with the
// spec's maximum of 0x8000 pairs is number 0x10000, which the 16-bit
// queue_select cannot name (truncated, it would configure rx0 again).
func planQueues(name string, size, pairs, maxPairs int, ctrl bool, nq int) ([]queueSpec, error) {
	type plan struct {
		name         string
		qidx, vector int
		size         int
	}
	var ps []plan
	for p := range pairs {
		ps = append(ps, plan{fmt.Sprintf("rx%d", p), 2 * p, 1 + 2*p, size}, plan{fmt.Sprintf("tx%d", p), 2*p + 1, 2 + 2*p, size})
	}
	if ctrl {
		ps = append(ps, plan{"ctrl", 2 * maxPairs, noVector, maxCtrlQueueSize})
	}
	specs := make([]queueSpec, 0, len(ps))
	for _, p := range ps {
		if p.qidx >= nq || p.qidx > 0xffff {
			return nil, fmt.Errorf("%w: %s has %d virtqueues, %s is number %d", nic.ErrNotSupported, name, nq, p.name, p.qidx)
		}
		specs = append(specs, queueSpec{p.name, uint16(p.qidx), p.size, uint16(p.vector)})
	}
	return specs, nil
}

// sizeQueues lists the virtqueues to set up (planQueues) with the size of
// each ring, from the device's queue_size registers (ringSize). It only
// reads and selects registers: a device that offers rings the driver
// cannot use is refused before any memory is allocated.
func (d *Device) sizeQueues(cfg Config, pairs int) ([]queueSpec, error) {
	t := d.t
	specs, err := planQueues(d.name, cfg.QueueSize, pairs, d.maxPairs, d.features.Has(FeatureCtrlVQ), int(t.r16(regNumQueues)))
	if err != nil {
		return nil, err
	}
	for i := range specs {
		s := &specs[i]
		t.w16(regQueueSelect, s.qidx)
		if s.size, err = ringSize(d.name, *s, int(t.r16(regQueueSize)), d.packed); err != nil {
			return nil, err
		}
	}
	return specs, nil
}

// minRingSize is the smallest data queue ring the driver sets up: its ring
// arithmetic and buffer ids are made for at least two descriptors. The
// control queue needs ctrlChain, a command's chain being outstanding at
// once.
const minRingSize = 2

// ringSize returns the ring size of queue s on a device whose queue_size
// register reads max: the smaller of s.size, max and 32768, rounded down
// to a power of two for a split ring. A queue the device does not offer
// (max 0) or offers smaller than the driver can use is refused with
// nic.ErrNotSupported: the device lacks what the driver needs.
func ringSize(dev string, s queueSpec, max int, packed bool) (int, error) {
	if max == 0 {
		return 0, fmt.Errorf("%w: %s: virtqueue %d (%s) is not available", nic.ErrNotSupported, dev, s.qidx, s.name)
	}
	size := min(s.size, max, 1<<15)
	if !packed {
		size = 1 << (bits.Len(uint(size)) - 1) // split rings are powers of two
	}
	need := minRingSize
	if s.name == "ctrl" {
		need = ctrlChain
	}
	if size < need {
		return 0, fmt.Errorf("%w: %s: virtqueue %d (%s) offers %d descriptors (queue_size %d), the driver needs %d",
			nic.ErrNotSupported, dev, s.qidx, s.name, size, max, need)
	}
	return size, nil
}

// setupQueues sizes the rings, allocates all DMA memory in one region and
// programs every queue.
func (d *Device) setupQueues(cfg Config, pairs int) error {
	t := d.t
	specs, err := d.sizeQueues(cfg, pairs)
	if err != nil {
		return err
	}
	txBuf := align(netHdrLen+d.mtu+nic.FrameOverhead, 64)
	total := 0
	for _, s := range specs {
		a, b, c, al := ringSizes(s.size, d.packed)
		total += a + b + c + 3*al
		switch s.name[:2] {
		case "rx":
			total += cfg.RxBuffers*align(cfg.BufferSize, 64) + 64
		case "tx":
			total += s.size*txBuf + 64
		default:
			total += ctrlBufLen + 64
		}
	}
	if d.space, err = dma.NewVFIOSpace(d.container, cfg.IOVAFloor); err != nil {
		return fmt.Errorf("virtio: DMA space of %s: %w", d.name, err)
	}
	region, err := d.space.Alloc(total, cfg.Memory)
	if err != nil {
		return fmt.Errorf("virtio: %d bytes of DMA memory for %s: %w", total, d.name, err)
	}
	eventIdx := d.features.Has(FeatureEventIdx)
	for _, s := range specs {
		mem, err := carveRing(region, s.size, d.packed)
		if err != nil {
			return fmt.Errorf("virtio: ring %s of %s: %w", s.name, d.name, err)
		}
		t.w16(regQueueSelect, s.qidx)
		t.w16(regQueueSize, uint16(s.size))
		t.w16(regQueueMSIXVector, s.vector)
		if v := t.r16(regQueueMSIXVector); v != s.vector {
			return fmt.Errorf("%w: %s: virtqueue %d (%s) did not take MSI-X vector %d (reads %#x)", nic.ErrDeviceFailed, d.name, s.qidx, s.name, s.vector, v)
		}
		t.w64(regQueueDesc, mem.descIOVA)
		t.w64(regQueueDriver, mem.driverIOVA)
		t.w64(regQueueDevice, mem.deviceIOVA)
		notify, err := t.notifyReg(t.r16(regQueueNotifyOff))
		if err != nil {
			return err
		}
		v, err := newVQ(s.name, s.qidx, s.size, d.packed, eventIdx, mem, notify)
		if err != nil {
			return err
		}
		t.w16(regQueueEnable, 1)
		p := int(s.qidx / 2)
		var efd *eventfd.FD
		if s.vector != noVector {
			efd = d.efds[s.vector]
		}
		switch s.name[:2] {
		case "rx":
			pool, err := dma.NewPool(region, cfg.RxBuffers, cfg.BufferSize)
			if err != nil {
				return fmt.Errorf("virtio: receive buffers of %s: %w", d.name, err)
			}
			q, err := newRxQueue(v, p, efd, pool, d.features.Has(FeatureMrgRxBuf))
			if err != nil {
				return err
			}
			q.Vector, q.VDev = int(s.vector), d.vdev
			q.setOffloads(d.features.Has(FeatureGuestCsum))
			d.rx = append(d.rx, q)
			d.core.Rx = append(d.core.Rx, &q.Queue)
		case "tx":
			pool, err := dma.NewPool(region, s.size, txBuf)
			if err != nil {
				return fmt.Errorf("virtio: transmit buffers of %s: %w", d.name, err)
			}
			q, err := newTxQueue(v, p, efd, pool, d.mtu)
			if err != nil {
				return err
			}
			q.Vector, q.VDev = int(s.vector), d.vdev
			q.csum = d.features.Has(FeatureCsum)
			d.tx = append(d.tx, q)
			d.core.Tx = append(d.core.Tx, &q.Queue)
		default:
			buf, err := region.Carve(ctrlBufLen, 64)
			if err != nil {
				return fmt.Errorf("virtio: control buffer of %s: %w", d.name, err)
			}
			d.ctrl = &ctrlQueue{vq: v, buf: buf}
		}
	}
	return nil
}

// carveRing takes a ring's three areas from r.
func carveRing(r *dma.Region, size int, packed bool) (ringMem, error) {
	a, b, c, al := ringSizes(size, packed)
	ds, err := r.Carve(a, al)
	if err != nil {
		return ringMem{}, err
	}
	dr, err := r.Carve(b, al)
	if err != nil {
		return ringMem{}, err
	}
	dv, err := r.Carve(c, al)
	if err != nil {
		return ringMem{}, err
	}
	return ringMem{desc: ds.Bytes, driver: dr.Bytes, device: dv.Bytes,
		descIOVA: ds.IOVA, driverIOVA: dr.IOVA, deviceIOVA: dv.IOVA}, nil
}

// configure runs the control commands: receive mode and queue pairs.
func (d *Device) configure(ctx context.Context, cfg Config, pairs int) error {
	if d.ctrl == nil {
		return nil
	}
	if d.features.Has(FeatureCtrlRx) {
		on := func(b bool) []byte {
			if b {
				return []byte{1}
			}
			return []byte{0}
		}
		// Unicast to our MAC, broadcast and every multicast group, or
		// everything when promiscuous.
		if err := d.ctrl.command(ctx, ctrlClassRx, ctrlRxPromisc, on(cfg.Promiscuous), ctrlTimeout); err != nil {
			return fmt.Errorf("virtio: %s: %w", d.name, err)
		}
		if err := d.ctrl.command(ctx, ctrlClassRx, ctrlRxAllMulti, on(true), ctrlTimeout); err != nil {
			return fmt.Errorf("virtio: %s: %w", d.name, err)
		}
	}
	if d.features.Has(FeatureMQ) {
		if err := d.ctrl.command(ctx, ctrlClassMQ, ctrlMQPairsSet, []byte{byte(pairs), byte(pairs >> 8)}, ctrlTimeout); err != nil {
			return fmt.Errorf("virtio: %s: %w", d.name, err)
		}
	}
	return nil
}

func (d *Device) fillInfo(cfg Config, pairs int) {
	ring := "split"
	if d.packed {
		ring = "packed"
	}
	d.info = nic.Info{
		Driver: "virtio", Address: d.name, Model: "virtio-net (" + ring + " ring)",
		MAC: d.mac, MTU: d.mtu, QueuePairs: pairs, MaxQueuePairs: d.maxPairs,
		QueueSize: int(d.rx[0].vq.size), RxBuffers: cfg.RxBuffers, BufferSize: d.rx[0].bufs.BufSize(),
		Vectors: len(d.efds), Features: d.features.Names(),
	}
}

// Info implements nic.Device.
func (d *Device) Info() nic.Info { return qcore.Info(d.info, d.mac) }

// Features returns the negotiated feature bits.
func (d *Device) Features() Features { return d.features }

// Packed reports whether the queues are packed rings.
func (d *Device) Packed() bool { return d.packed }

// MAC implements nic.Device.
func (d *Device) MAC() net.HardwareAddr { return append(net.HardwareAddr(nil), d.mac...) }

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

// Link implements nic.Device: the STATUS field of the device configuration
// when negotiated (otherwise the link is reported up), and speed and duplex
// when the device reports them.
func (d *Device) Link() (nic.Link, error) {
	d.core.Mu.Lock()
	defer d.core.Mu.Unlock()
	if d.core.Closed {
		return nic.Link{}, nic.ErrClosed
	}
	d.takeConfigInterrupts()
	if s := d.t.status(); s&statusDeviceNeedsReset != 0 {
		return nic.Link{}, fmt.Errorf("%w: %s: DEVICE_NEEDS_RESET (status %#x)", nic.ErrDeviceFailed, d.name, s)
	}
	l := nic.Link{Up: true}
	f := d.features
	err := d.t.readConfig(func(w doorbell.Window) error {
		if f.Has(FeatureStatus) {
			v, err := w.Read16(netCfgStatus)
			if err != nil {
				return err
			}
			l.Up, l.Reported = v&netStatusLinkUp != 0, true
		}
		if f.Has(FeatureSpeedDuplex) {
			sp, err := w.Read32(netCfgSpeed)
			if err != nil {
				return err
			}
			dup, err := w.Read8(netCfgDuplex)
			if err != nil {
				return err
			}
			if sp != netSpeedUnknown {
				l.SpeedMbps = int(sp)
			}
			l.FullDuplex = dup == netDuplexFull
		}
		return nil
	})
	return l, err
}

// takeConfigInterrupts moves pending configuration interrupts to the counter.
func (d *Device) takeConfigInterrupts() {
	if d.cfgEFD != nil {
		n, _ := d.cfgEFD.Take()
		d.cfgIntr.Add(n)
	}
}

// ConfigInterrupt is the eventfd that configuration changes (link up or
// down) signal; the device keeps ownership. Nil after a failed Open.
func (d *Device) ConfigInterrupt() *eventfd.FD { return d.cfgEFD }

// Stats implements nic.Device.
func (d *Device) Stats() nic.Stats {
	d.core.Mu.Lock()
	if !d.core.Closed {
		d.takeConfigInterrupts()
	}
	d.core.Mu.Unlock()
	return d.core.Stats(d.cfgIntr.Load())
}

// Close stops the device and releases everything: it waits for queue
// operations in progress, resets the device (status 0) so it stops using
// the rings, disables MSI-X and bus mastering, frees the DMA memory, closes
// the VFIO device, group and container, and closes the eventfds, which
// wakes goroutines blocked in SRead with ErrClosed. CQs that queues were
// bound to receive a flushed error completion (cq.ECANCELED) for each
// operation still outstanding on those queues (nic.Device.BindCQ), and are
// unbound (and may then be closed). A device that Open bound
// to vfio-pci then goes back to the driver it had (Info.PreviousDriver)
// unless Config.KeepBound. Close is idempotent.
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
	if d.t != nil {
		if err := d.t.reset(context.Background(), resetTimeout); err != nil {
			errs = append(errs, err)
		}
	}
	// The DMA memory stays mapped until Close (qcore's CloseFunction):
	// the kernel may take the device back while a goroutine reads a lent
	// frame.
	errs = append(errs, qcore.ReleaseFunction(d.vdev, d.container, d.space, d.efds))
	return errors.Join(errs...)
}

func align(n, a int) int { return (n + a - 1) &^ (a - 1) }

func littleEndian() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}
