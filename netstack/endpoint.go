package netstack

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/stack/gro"

	"github.com/vfnic/vfnic/lcore"
	"github.com/vfnic/vfnic/nic"
)

// endpoint is the stack's link endpoint on a nic.Device: Ethernet framing,
// a receive handler per receive queue (run by a polling core), and
// transmit batches written by the fifo qdisc's dispatchers, one per
// transmit queue.
type endpoint struct {
	dev  nic.Device
	mtu  uint32
	mac  tcpip.LinkAddress
	caps stack.LinkEndpointCapabilities

	disp atomic.Pointer[dispatcher]

	// rxOffload: the device's receive checksum verdicts are used.
	rxOffload bool
	// gro: each receive queue coalesces the TCP segments of a flow that
	// arrive in one batch before the stack sees them (gVisor's GRO).
	gro bool
	// claim orders deliveries by whether the stack may skip verifying
	// the packet's checksums. gVisor reads CapabilityRXChecksumOffload
	// once per packet as it takes it in, for the whole NIC, and carries
	// the verdict through reassembly. A receive queue delivers packets
	// whose checksums were verified (by the device, by the endpoint, or
	// by GRO, whose coalesced packets keep stale checksums) under the
	// read lock, with the capability claimed, and the others (fragments,
	// IPv6 extension headers, bad checksums, which the stack counts)
	// under the write lock with claimOff set, so that the stack checks
	// them itself and no verified packet is delivered meanwhile.
	claim    sync.RWMutex
	claimOff atomic.Bool
	// txOffload: the device fills in TCP and UDP checksums
	// (CapabilityTXChecksumOffload is in caps).
	txOffload bool
	// gso: TCP builds segments of up to stack.GVisorGSOMaxSize bytes
	// and cuts them into MSS-sized packets just before the link
	// (GSOEndpoint), as Linux's GSO does where a device has no TSO.
	gso bool

	rx []rxQueue
	tx []txQueue

	// dropEvery drops every dropEvery-th frame received and sent (0:
	// none): the test-only fault that makes TCP retransmit through a
	// real NIC.
	dropEvery atomic.Uint64

	// closed is called (once) when a send finds the device closed or
	// taken back: the Net wakes its polling cores, which then stop on
	// the closed queues even if they slept (closing a queue's eventfd
	// does not wake a core asleep in epoll on it).
	closed     func()
	closedOnce sync.Once

	// capture, if not nil, records the frames received and sent.
	capture *pcap

	rxFrames, rxDropped, rxErrors atomic.Uint64
	txFrames, txDropped           atomic.Uint64
	rxCsumDevice, rxCsumBad       atomic.Uint64
	txCsumDevice                  atomic.Uint64
}

// rxChecksummer is a receive queue whose device checks the checksums of
// the frames it receives (nic/igb).
type rxChecksummer interface {
	// ChecksumVerified says whether the device verified the TCP or UDP
	// checksum of the frame lent at buf (and, for IPv4, its header
	// checksum), and whether they were correct.
	ChecksumVerified(buf uintptr) (checked, valid bool, err error)
}

// txChecksummer is a transmit queue whose device fills in TCP and UDP
// checksums (nic/igb).
type txChecksummer interface {
	// SendL4Checksum is Send with the device computing the frame's TCP
	// or UDP checksum; frames it cannot handle fail with an error
	// matching nic.ErrNotSupported.
	SendL4Checksum(frame []byte, ctx any) error
}

// checksumOffloader is a queue whose checksum methods above work only
// when its device has the offload (nic/virtio: negotiated or not).
type checksumOffloader interface {
	// ChecksumOffload reports whether the device does the queue's
	// checksum offload.
	ChecksumOffload() bool
}

// partialKeeper is a receive queue whose device may deliver frames whose
// checksum was never computed (virtio's NEEDS_CSUM). The driver completes
// them unless asked to keep them: with receive offload on the stack takes
// the device's word for them and asks.
type partialKeeper interface {
	KeepPartialChecksums(keep bool)
}

// dispatcher boxes the stack's NetworkDispatcher for an atomic pointer.
type dispatcher struct{ d stack.NetworkDispatcher }

type rxQueue struct {
	ep   *endpoint
	q    nic.RxQueue
	csum rxChecksummer // nil without receive checksum offload
	seen uint64        // frames seen, for dropEvery (the core's thread only)
	gro  gro.GRO       // its Dispatcher is out
	out  deliverer
}

// deliverer hands a receive queue's packets to the stack, in the order of
// endpoint.claim: the stack's dispatcher for GRO (its Dispatcher), and
// the endpoint's own delivery when GRO is off. The core's thread only.
type deliverer struct {
	e *endpoint
	d stack.NetworkDispatcher // this batch's
	// shared: the read lock of claim is held, for verified packets; it
	// is released at the end of the batch or for an unverified packet.
	shared bool
}

// DeliverNetworkPacket implements stack.NetworkDispatcher.
func (o *deliverer) DeliverNetworkPacket(proto tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) {
	e := o.e
	if pkt.RXChecksumValidated {
		if !o.shared {
			e.claim.RLock()
			o.shared = true
		}
		o.d.DeliverNetworkPacket(proto, pkt)
		return
	}
	o.release()
	e.claim.Lock()
	e.claimOff.Store(true)
	o.d.DeliverNetworkPacket(proto, pkt)
	e.claimOff.Store(false)
	e.claim.Unlock()
}

// DeliverLinkPacket implements stack.NetworkDispatcher.
func (o *deliverer) DeliverLinkPacket(proto tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) {
	o.d.DeliverLinkPacket(proto, pkt)
}

// release ends a run of verified deliveries.
func (o *deliverer) release() {
	if o.shared {
		o.e.claim.RUnlock()
		o.shared = false
	}
}

type txQueue struct {
	mu      sync.Mutex
	q       nic.TxQueue
	csum    txChecksummer       // nil without transmit checksum offload
	seen    uint64              // packets written, for dropEvery
	limit   int                 // sends outstanding before a write waits (half the ring; the rest is spare)
	scratch []byte              // one frame, gathered from the packet's views
	pkt     *stack.PacketBuffer // the packet fill gathers (SendFunc)
	fill    func([]byte)        // t.gatherPkt, made once
	comps   []nic.Completion    // transmit completions reaped before sending

	// With Config.CoreTransmit: packets the stack's senders queued for
	// the polling core of this queue's pair (under qmu, at most qlen),
	// nq their count, and the core (for its Wake) once it runs. cur and
	// off are the core's: the packets it took, and how far it got.
	qmu    sync.Mutex
	queued []*stack.PacketBuffer
	qlen   int
	nq     atomic.Int32
	core   atomic.Pointer[lcore.Core]
	cur    []*stack.PacketBuffer
	off    int
}

// txWait bounds how long a write waits for the device to complete sends
// when its ring is full, before it drops the rest of the batch (TCP
// retransmits; UDP loses datagrams, as on a full Linux qdisc).
const txWait = 20 * time.Millisecond

func newEndpoint(dev nic.Device, dropEvery int, noRxCsum, noTxCsum, noGSO, noGRO bool) (*endpoint, error) {
	info := dev.Info()
	e := &endpoint{
		dev:  dev,
		mac:  tcpip.LinkAddress(dev.MAC()),
		caps: stack.CapabilityResolutionRequired,
		gso:  !noGSO,
		gro:  !noGRO,
	}
	e.dropEvery.Store(uint64(max(dropEvery, 0)))
	n := dev.QueuePairs()
	if n < 1 {
		return nil, errors.New("netstack: device has no queue pairs")
	}
	maxFrame := -1
	e.rx = make([]rxQueue, n)
	e.tx = make([]txQueue, n)
	for i := 0; i < n; i++ {
		rq, err := dev.Rx(i)
		if err != nil {
			return nil, err
		}
		tq, err := dev.Tx(i)
		if err != nil {
			return nil, err
		}
		e.rx[i] = rxQueue{ep: e, q: rq, out: deliverer{e: e}}
		e.tx[i] = txQueue{q: tq, scratch: make([]byte, tq.MaxFrame()), comps: make([]nic.Completion, 64),
			limit: max(tq.Size()/2, 1)}
		e.tx[i].fill = e.tx[i].gatherPkt
		e.rx[i].csum, _ = rq.(rxChecksummer)
		e.tx[i].csum, _ = tq.(txChecksummer)
		if o, ok := rq.(checksumOffloader); ok && !o.ChecksumOffload() {
			e.rx[i].csum = nil
		}
		if o, ok := tq.(checksumOffloader); ok && !o.ChecksumOffload() {
			e.tx[i].csum = nil
		}
		for _, m := range []int{rq.MaxFrame(), tq.MaxFrame()} {
			if maxFrame < 0 || m < maxFrame {
				maxFrame = m
			}
		}
	}
	// The link MTU leaves room for the Ethernet header and the VLAN tags
	// the queues' MaxFrame allows for; the device's own MTU caps it.
	mtu := maxFrame - nic.FrameOverhead
	if info.MTU > 0 && info.MTU < mtu {
		mtu = info.MTU
	}
	if mtu < header.IPv4MinimumMTU {
		return nil, errors.New("netstack: device frames too short for IPv4")
	}
	e.mtu = uint32(mtu)
	// An offload is used when every queue has it and it is not turned
	// off.
	e.rxOffload, e.txOffload = !noRxCsum, !noTxCsum
	for i := range e.rx {
		if e.rx[i].csum == nil {
			e.rxOffload = false
		}
		if e.tx[i].csum == nil {
			e.txOffload = false
		}
	}
	for i := range e.rx {
		e.rx[i].gro.Init(e.gro)
		e.rx[i].gro.Dispatcher = &e.rx[i].out
		if !e.rxOffload {
			e.rx[i].csum = nil
		}
		if k, ok := e.rx[i].q.(partialKeeper); ok {
			// With the offload on, the device's partial frames count
			// as verified; off, the driver completes them.
			k.KeepPartialChecksums(e.rxOffload)
		}
		if !e.txOffload {
			e.tx[i].csum = nil
		}
	}
	if e.txOffload {
		e.caps |= stack.CapabilityTXChecksumOffload
	}
	return e, nil
}

// MTU implements stack.LinkEndpoint.
func (e *endpoint) MTU() uint32 { return e.mtu }

// SetMTU implements stack.LinkEndpoint: the device's frame size is fixed.
func (e *endpoint) SetMTU(uint32) {}

// MaxHeaderLength implements stack.LinkEndpoint.
func (e *endpoint) MaxHeaderLength() uint16 { return header.EthernetMinimumSize }

// LinkAddress implements stack.LinkEndpoint.
func (e *endpoint) LinkAddress() tcpip.LinkAddress { return e.mac }

// SetLinkAddress implements stack.LinkEndpoint: the device's MAC is fixed.
func (e *endpoint) SetLinkAddress(tcpip.LinkAddress) {}

// Capabilities implements stack.LinkEndpoint. The stack reads it for each
// packet it takes in: receive checksum offload is claimed but while a
// packet whose checksums nobody verified is being delivered (claim).
func (e *endpoint) Capabilities() stack.LinkEndpointCapabilities {
	if !e.claimOff.Load() {
		return e.caps | stack.CapabilityRXChecksumOffload
	}
	return e.caps
}

// SupportedGSO implements stack.GSOEndpoint: gVisor's software GSO unless
// turned off. TCP then sends, acknowledges and retransmits segments of up
// to GSOMaxSize bytes and cuts each into MSS-sized packets as it writes
// it (one pass of the sender per 64 KiB instead of per 1.4 KiB); the
// link sees packets that fit the MTU either way.
func (e *endpoint) SupportedGSO() stack.SupportedGSO {
	if e.gso {
		return stack.GVisorGSOSupported
	}
	return stack.GSONotSupported
}

// GSOMaxSize implements stack.GSOEndpoint.
func (e *endpoint) GSOMaxSize() uint32 {
	if e.gso {
		return stack.GVisorGSOMaxSize
	}
	return 0
}

// Attach implements stack.LinkEndpoint. The receive handlers deliver to
// the dispatcher; nil (the NIC being removed) makes them drop frames.
func (e *endpoint) Attach(d stack.NetworkDispatcher) {
	if d == nil {
		e.disp.Store(nil)
		return
	}
	e.disp.Store(&dispatcher{d})
}

// IsAttached implements stack.LinkEndpoint.
func (e *endpoint) IsAttached() bool { return e.disp.Load() != nil }

// Wait implements stack.LinkEndpoint: the polling cores belong to the
// Net, which stops them.
func (e *endpoint) Wait() {}

// ARPHardwareType implements stack.LinkEndpoint.
func (e *endpoint) ARPHardwareType() header.ARPHardwareType { return header.ARPHardwareEther }

// AddHeader implements stack.LinkEndpoint.
func (e *endpoint) AddHeader(pkt *stack.PacketBuffer) {
	eth := header.Ethernet(pkt.LinkHeader().Push(header.EthernetMinimumSize))
	eth.Encode(&header.EthernetFields{
		SrcAddr: pkt.EgressRoute.LocalLinkAddress,
		DstAddr: pkt.EgressRoute.RemoteLinkAddress,
		Type:    pkt.NetworkProtocolNumber,
	})
}

// ParseHeader implements stack.LinkEndpoint.
func (e *endpoint) ParseHeader(pkt *stack.PacketBuffer) bool {
	_, ok := pkt.LinkHeader().Consume(header.EthernetMinimumSize)
	return ok
}

// Close implements stack.LinkEndpoint.
func (e *endpoint) Close() {}

// SetOnCloseAction implements stack.LinkEndpoint.
func (e *endpoint) SetOnCloseAction(func()) {}

// handle is the receive queue's lcore.Handler: each frame is copied into
// a view from gVisor's pool and its DMA buffer reposted before the stack
// sees it, so that the ring is refilled whatever the stack does. Frames
// go to the stack through GRO when it is on, which holds a flow's
// segments until the end of the batch.
func (r *rxQueue) handle(_ nic.Queue, batch []nic.Completion) error {
	e := r.ep
	drop := e.dropEvery.Load()
	p := e.disp.Load()
	if p == nil {
		r.out.d = nil
	} else {
		r.out.d = p.d
	}
	defer r.end()
	for i := range batch {
		c := &batch[i]
		if c.Err != nil {
			// The driver recycled the buffer into its pool: post a free
			// one in its place, or the ring shrinks by one with each
			// error. A removal's canceled operations end here too (the
			// post fails), and the core stops at its next flush or
			// sleep with the device's error.
			e.rxErrors.Add(1)
			_ = r.q.PostRecv(nil)
			continue
		}
		data := c.Data
		if e.capture != nil {
			e.capture.frame(data)
		}
		// The device's verdict is read while the buffer is lent.
		verified, checked := false, false
		if r.csum != nil {
			var valid bool
			var err error
			checked, valid, err = r.csum.ChecksumVerified(c.Buf)
			checked = checked && err == nil
			verified = checked && valid
			if checked && !valid {
				// The stack verifies it too, counts and drops it.
				e.rxCsumBad.Add(1)
			}
		}
		var v *buffer.View
		r.seen++
		switch {
		case r.out.d == nil || len(data) < header.EthernetMinimumSize:
			e.rxDropped.Add(1)
		case drop != 0 && r.seen%drop == 0:
			e.rxDropped.Add(1)
		default:
			v = buffer.NewViewWithData(data)
		}
		if err := r.q.Repost(c.Buf, nil); err != nil {
			if v != nil {
				v.Release()
			}
			return err
		}
		if v == nil {
			continue
		}
		e.rxFrames.Add(1)
		if verified {
			e.rxCsumDevice.Add(1)
		} else if !checked {
			// The endpoint verifies what the device did not, on the
			// copy, so that such packets are delivered with the others.
			verified = checksumsValid(v.AsSlice())
		}
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithView(v)})
		pkt.NetworkProtocolNumber = header.Ethernet(v.AsSlice()).Type()
		pkt.RXChecksumValidated = verified
		if e.ParseHeader(pkt) {
			r.gro.Enqueue(pkt)
		}
		pkt.DecRef()
	}
	return nil
}

// end ends a batch: the segments GRO holds go to the stack, and the
// batch's run of verified deliveries ends.
func (r *rxQueue) end() {
	r.gro.Flush()
	r.out.release()
}

// coreQDisc is the stack's queueing discipline with Config.CoreTransmit:
// a sender queues the packet for the polling core of its transmit queue's
// pair and wakes the core when the queue was empty; the core writes the
// queued packets to the device in its rounds (drain), with the frames it
// receives, so that no dispatcher goroutine stands between the stack and
// the device.
type coreQDisc struct{ e *endpoint }

// WritePacket implements stack.QueueingDiscipline.
func (q coreQDisc) WritePacket(pkt *stack.PacketBuffer) tcpip.Error {
	e := q.e
	t := &e.tx[int(pkt.Hash)%len(e.tx)]
	t.qmu.Lock()
	if len(t.queued) >= t.qlen {
		t.qmu.Unlock()
		e.txDropped.Add(1)
		return &tcpip.ErrNoBufferSpace{}
	}
	t.queued = append(t.queued, pkt.IncRef())
	first := t.nq.Add(1) == 1
	t.qmu.Unlock()
	if c := t.core.Load(); first && c != nil {
		// A core that stopped has its error in the Net; the packet
		// is released with the queue.
		_ = c.Wake()
	}
	return nil
}

// Close implements stack.QueueingDiscipline: the packets still queued are
// released (the cores have stopped: the Net closes them first).
func (q coreQDisc) Close() {
	for i := range q.e.tx {
		t := &q.e.tx[i]
		t.qmu.Lock()
		for _, p := range t.queued {
			p.DecRef()
		}
		clear(t.queued)
		t.queued, t.qlen = t.queued[:0], 0 // a later send is refused
		t.nq.Store(0)
		t.qmu.Unlock()
		for _, p := range t.cur[t.off:] {
			p.DecRef()
		}
		clear(t.cur)
		t.cur, t.off = t.cur[:0], 0
	}
}

// drainBatch bounds the packets a core writes per round, so that its
// receive queue is polled between batches.
const drainBatch = 64

// drain is the polling core's Func for transmit queue t (Config.
// CoreTransmit): it writes up to drainBatch queued packets with one
// Flush, taking the senders' queue when its own is done.
func (e *endpoint) drain(t *txQueue) (int, error) {
	if t.off == len(t.cur) {
		if t.nq.Load() == 0 {
			return 0, nil
		}
		// Swap: the senders append to the core's emptied slice.
		clear(t.cur)
		t.qmu.Lock()
		t.cur, t.queued = t.queued, t.cur[:0]
		t.nq.Store(0)
		t.qmu.Unlock()
		t.off = 0
	}
	n := min(len(t.cur)-t.off, drainBatch)
	batch := t.cur[t.off : t.off+n]
	t.off += n
	_, _ = e.write(batch) // a closed device stops the Net (e.closed); losses count in txDropped
	for _, p := range batch {
		p.DecRef()
	}
	return n, nil
}

// WritePackets implements stack.LinkWriter. The fifo qdisc calls it from
// the dispatcher of one transmit queue with up to fifo.BatchSize packets
// of that queue's hash class; they go to the device with one Flush.
func (e *endpoint) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	return e.write(pkts.AsSlice())
}

// write posts the packets, all of one transmit queue's hash class, to
// that queue with one Flush, and says how many were dealt with.
func (e *endpoint) write(list []*stack.PacketBuffer) (int, tcpip.Error) {
	if len(list) == 0 {
		return 0, nil
	}
	t := &e.tx[int(list[0].Hash)%len(e.tx)]
	t.mu.Lock()
	defer t.mu.Unlock()
	t.reap()
	drop := e.dropEvery.Load()
	// done counts the packets dealt with (posted, or dropped as the wire
	// would drop them); the rest are dropped for an error and the stack
	// told how many went.
	done, posted := 0, 0
	var terr tcpip.Error
	for _, pkt := range list {
		if t.seen++; drop != 0 && t.seen%drop == 0 {
			done++
			continue
		}
		if pkt.Size() > len(t.scratch) {
			done++ // longer than the device's frames: dropped
			continue
		}
		var err error
		if t.q.Outstanding() >= t.limit {
			// The device has not sent what is queued: hand it what
			// this batch posted so far and wait for completions.
			// Whether or not any came, the send below goes into the
			// spare slots and its Flush notifies the device afresh,
			// so that a device that went idle waiting for a doorbell
			// is woken (a full ring left stuck by QEMU's packed-ring
			// event index was fixed in nic/virtio's kickNeeded; this
			// keeps the queue moving with any device that errs so).
			err = t.q.Flush()
			if err == nil {
				t.await()
			}
		}
		if err == nil {
			err = e.send(t, pkt)
		}
		if err != nil {
			terr = e.txError(err)
			break
		}
		done++
		posted++
	}
	if err := t.q.Flush(); err != nil && terr == nil {
		terr = e.txError(err)
	}
	e.txFrames.Add(uint64(posted))
	e.txDropped.Add(uint64(len(list) - posted))
	return done, terr
}

// send posts one packet. Without transmit checksum offload (the stack
// computed every checksum) its views are gathered straight into the
// queue's DMA buffer (SendFunc); with it, the device fills in the
// checksum of a TCP or UDP frame, which the stack left out, from a frame
// gathered first so that its headers can be parsed. A capture sees the
// frame as sent.
func (e *endpoint) send(t *txQueue, pkt *stack.PacketBuffer) error {
	if t.csum == nil && e.capture == nil {
		t.pkt = pkt
		err := t.q.SendFunc(pkt.Size(), nil, t.fill)
		t.pkt = nil
		return err
	}
	frame := t.scratch[:gather(t.scratch, pkt)]
	err := e.sendFrame(t, frame)
	if err == nil && e.capture != nil {
		e.capture.frame(frame)
	}
	return err
}

// sendFrame posts a gathered frame, with checksum offload when the queue
// has it and the frame is TCP or UDP.
func (e *endpoint) sendFrame(t *txQueue, frame []byte) error {
	if t.csum == nil || !needsL4Checksum(frame) {
		return t.q.Send(frame, nil)
	}
	err := t.csum.SendL4Checksum(frame, nil)
	if err == nil {
		e.txCsumDevice.Add(1)
		return nil
	}
	if !errors.Is(err, nic.ErrNotSupported) {
		return err
	}
	// Headers the device cannot parse: the checksum is computed here.
	setL4Checksum(frame)
	return t.q.Send(frame, nil)
}

// gatherPkt is SendFunc's fill: t.pkt's bytes into the lent buffer.
func (t *txQueue) gatherPkt(b []byte) { gather(b, t.pkt) }

// gather copies pkt's bytes into dst, which holds them (the caller
// checks), and returns their length.
func gather(dst []byte, pkt *stack.PacketBuffer) int {
	views, off := pkt.AsViewList()
	n := 0
	for v := views.Front(); v != nil; v = v.Next() {
		b := v.AsSlice()
		if off >= len(b) {
			off -= len(b)
			continue
		}
		n += copy(dst[n:], b[off:])
		off = 0
	}
	return n
}

// reap reads the transmit completions that are ready, freeing their
// descriptors. Only the writer holding t.mu reads the queue.
func (t *txQueue) reap() {
	for t.q.Poll(t.comps) == len(t.comps) {
	}
}

// await waits up to txWait for at least one transmit completion.
func (t *txQueue) await() {
	deadline := time.Now().Add(txWait)
	for {
		if t.q.Poll(t.comps) > 0 {
			t.reap()
			return
		}
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(20 * time.Microsecond)
	}
}

// txError maps a queue's error to the stack's: a closed or removed device
// is closed for sending, anything else a dropped batch.
func (e *endpoint) txError(err error) tcpip.Error {
	if errors.Is(err, nic.ErrClosed) || errors.Is(err, nic.ErrRemoved) {
		if e.closed != nil {
			e.closedOnce.Do(e.closed)
		}
		return &tcpip.ErrClosedForSend{}
	}
	return &tcpip.ErrNoBufferSpace{}
}
