package virtiovm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/virtio"
	"github.com/vfnic/vfnic/qemu"
	"golang.org/x/sys/unix"
)

const (
	frames   = 10000 // per correctness test and direction
	window   = 48    // host->guest frames in flight beyond the last ack
	ackEvery = 12
	benchFor = 2 * time.Second
)

func guestOnly(t *testing.T) {
	t.Helper()
	if !qemu.InGuest() {
		t.Skip("needs the guest's virtio-net NICs: runs inside the QEMU guest booted by TestVM")
	}
}

func addrOf(slot int) string { return fmt.Sprintf("0000:00:%02x.0", slot) }

// resources counts what Close must give back: open fds, and the mappings
// of VFIO regions and hugepages.
type resources struct{ fds, maps int }

func snapshot(t *testing.T) resources {
	t.Helper()
	// The runtime poller keeps its own fds once the first eventfd used
	// it: start it before counting.
	pollerOnce.Do(func() {
		if e, err := eventfd.New(); err == nil {
			_ = e.Close()
		}
	})
	fds, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	maps, err := os.ReadFile("/proc/self/maps")
	require.NoError(t, err)
	n := 0
	for _, l := range strings.Split(string(maps), "\n") {
		if strings.Contains(l, "vfio") || strings.Contains(l, "huge") {
			n++
		}
	}
	return resources{len(fds), n}
}

var pollerOnce sync.Once

// peer is a guest test's end of the conversation with the host side.
type peer struct {
	t       *testing.T
	dev     *virtio.Device
	rx      *virtio.RxQueue
	tx      *virtio.TxQueue
	mac     net.HardwareAddr
	session uint32
	comps   []nic.Completion
	txc     []nic.Completion
	stale   int
}

// openPeer opens the NIC in slot, fills its receive ring and says hello
// to the host; Close (checked to release everything) runs at cleanup.
func openPeer(t *testing.T, slot int, cfg virtio.Config) *peer {
	t.Helper()
	before := snapshot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dev, err := virtio.Open(ctx, addrOf(slot), cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, dev.Close())
		require.NoError(t, dev.Close(), "Close is idempotent")
		require.Equal(t, before, snapshot(t), "Close returns every fd and mapping")
	})
	p := &peer{t: t, dev: dev, mac: dev.MAC(), comps: make([]nic.Completion, 64), txc: make([]nic.Completion, 64),
		session: uint32(time.Now().UnixNano())&0x7fffffff | 1}
	p.rx, err = dev.RxQueue(0)
	require.NoError(t, err)
	p.tx, err = dev.TxQueue(0)
	require.NoError(t, err)
	for p.rx.PostRecv(nil) == nil {
	}
	require.Equal(t, p.rx.Size(), p.rx.Outstanding(), "the whole ring is posted")
	require.NoError(t, p.rx.Flush())
	p.hello()
	return p
}

// ctl builds a control frame for the host.
func (p *peer) ctl(typ uint8, args ...uint32) []byte {
	m := msg{typ: typ, session: p.session}
	copy(m.args[:], args)
	return build(hostMAC, p.mac, m, minFrame)
}

// send transmits f and waits for nothing; completions are reclaimed.
func (p *peer) send(f []byte) {
	p.t.Helper()
	for {
		err := p.tx.Send(f, nil)
		if err == nil {
			break
		}
		require.ErrorIs(p.t, err, nic.ErrFull)
		require.NoError(p.t, p.tx.Flush())
		p.reclaim()
	}
	require.NoError(p.t, p.tx.Flush())
	p.reclaim()
}

func (p *peer) reclaim() {
	p.t.Helper()
	for {
		n := p.tx.Poll(p.txc)
		for _, c := range p.txc[:n] {
			require.NoError(p.t, c.Err)
		}
		if n < len(p.txc) {
			return
		}
	}
}

// recv hands every frame of this session to fn until fn says done (the
// rest of that batch is still handed over), reposting each buffer.
// Frames from earlier sessions on this NIC are counted and dropped.
func (p *peer) recv(timeout time.Duration, fn func(f []byte, m msg) bool) {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		n, err := p.rx.SRead(context.Background(), p.comps, 1, time.Until(deadline))
		if errors.Is(err, nic.ErrTimeout) {
			p.t.Fatalf("no frame from the host in %v", timeout)
		}
		require.NoError(p.t, err)
		done := false
		for _, c := range p.comps[:n] {
			require.NoError(p.t, c.Err, "a completion from QEMU's device is valid")
			if m, ok := peek(c.Data); ok && m.session == p.session {
				done = fn(c.Data, m) || done
			} else {
				p.stale++
			}
			require.NoError(p.t, p.rx.Repost(c.Buf, nil))
		}
		require.NoError(p.t, p.rx.Flush())
		if done {
			return
		}
	}
}

// await receives until a frame of type typ arrives and returns it.
func (p *peer) await(typ uint8, timeout time.Duration) msg {
	p.t.Helper()
	var got msg
	p.recv(timeout, func(f []byte, m msg) bool {
		if m.typ != typ {
			p.t.Fatalf("waiting for message %d, got %d", typ, m.typ)
		}
		got = m
		return true
	})
	return got
}

// hello starts a session with the host side. QEMU has bound its socket
// by the time the guest runs, so one hello suffices; it is repeated in case
// the host's answer raced with the ring being posted.
func (p *peer) hello() {
	p.t.Helper()
	for try := 0; ; try++ {
		p.send(p.ctl(msgHello))
		n, err := p.rx.SRead(context.Background(), p.comps, 1, time.Second)
		if err == nil {
			ok := false
			for _, c := range p.comps[:n] {
				if m, good := peek(c.Data); good && m.session == p.session && m.typ == msgHelloAck {
					ok = true
				} else {
					p.stale++
				}
				require.NoError(p.t, p.rx.Repost(c.Buf, nil))
			}
			require.NoError(p.t, p.rx.Flush())
			if ok {
				return
			}
		}
		require.Less(p.t, try, 10, "the host answers hello")
	}
}

// TestGuestBlocking* run first on each NIC, before other tests leave
// frames behind: with no traffic a blocking read must sleep until its
// timeout without burning CPU, and a frame must wake it through MSI-X.
func TestGuestBlockingPacked(t *testing.T) { guestOnly(t); testBlocking(t, slotPacked) }

// TestGuestBlockingSplit is TestGuestBlockingPacked on split rings.
func TestGuestBlockingSplit(t *testing.T) { guestOnly(t); testBlocking(t, slotSplit) }

func cpuTime(t *testing.T) time.Duration {
	var ru unix.Rusage
	require.NoError(t, unix.Getrusage(unix.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func testBlocking(t *testing.T, slot int) {
	p := openPeer(t, slot, virtio.Config{})
	const wait = 2 * time.Second
	cpu0, t0 := cpuTime(t), time.Now()
	n, err := p.rx.SRead(context.Background(), p.comps, 1, wait)
	el, cpu := time.Since(t0), cpuTime(t)-cpu0
	require.ErrorIs(t, err, nic.ErrTimeout)
	require.Zero(t, n)
	t.Logf("idle read: timed out after %v using %v of CPU (%.2f%%)", el.Round(time.Millisecond), cpu, 100*cpu.Seconds()/el.Seconds())
	require.GreaterOrEqual(t, el, wait, "not before the timeout")
	require.Less(t, el, wait+500*time.Millisecond, "on time")
	require.Less(t, cpu, wait/20, "a sleeping read burns under 5% of a CPU")

	intr0 := p.rx.Stats().Interrupts
	p.send(p.ctl(msgDelayedReq, 500))
	cpu0, t0 = cpuTime(t), time.Now()
	n, err = p.rx.SRead(context.Background(), p.comps, 1, 10*time.Second)
	el, cpu = time.Since(t0), cpuTime(t)-cpu0
	require.NoError(t, err)
	require.Equal(t, 1, n)
	c := p.comps[0]
	require.NoError(t, c.Err)
	require.NoError(t, checkData(c.Data, p.mac, hostMAC, p.session, 0))
	require.NoError(t, p.rx.Repost(c.Buf, nil))
	intr := p.rx.Stats().Interrupts - intr0
	t.Logf("woken by a frame after %v (host waited 500 ms) by %d interrupt(s), using %v of CPU", el.Round(time.Millisecond), intr, cpu)
	require.GreaterOrEqual(t, el, 400*time.Millisecond, "the read slept until the frame came")
	require.NotZero(t, intr, "the MSI-X interrupt counter moved")
	require.Less(t, cpu, el/20)

	// Close wakes a read blocked on the interrupt.
	done := make(chan error, 1)
	go func() {
		_, err := p.rx.SRead(context.Background(), make([]nic.Completion, 4), 1, 30*time.Second)
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	t0 = time.Now()
	require.NoError(t, p.dev.Close())
	select {
	case err := <-done:
		require.ErrorIs(t, err, nic.ErrClosed)
		t.Logf("Close woke the blocked read in %v", time.Since(t0).Round(time.Microsecond))
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake the blocked read")
	}
}

// TestGuestRxPacked has the host send 10,000 frames of mixed sizes; every
// one must arrive in order and intact (parsed with gopacket), across many
// laps of the ring. A frame to another MAC, sent first, must be filtered.
func TestGuestRxPacked(t *testing.T) { guestOnly(t); testRx(t, slotPacked, true) }

// TestGuestRxSplit is TestGuestRxPacked on split rings.
func TestGuestRxSplit(t *testing.T) { guestOnly(t); testRx(t, slotSplit, false) }

func testRx(t *testing.T, slot int, packed bool) {
	p := openPeer(t, slot, virtio.Config{})
	require.Equal(t, packed, p.dev.Packed())
	start := time.Now()
	p.send(p.ctl(msgSendReq, frames, window))
	next := uint32(0)
	p.recv(60*time.Second, func(f []byte, m msg) bool {
		switch m.typ {
		case msgData:
			if m.seq != next {
				t.Fatalf("frame %d arrived when %d was due: lost, reordered or unfiltered", m.seq, next)
			}
			require.NoError(t, checkData(f, p.mac, hostMAC, p.session, next))
			next++
			if next%ackEvery == 0 || next == frames {
				p.send(p.ctl(msgAck, next))
			}
			return false
		case msgSendDone:
			require.Equal(t, uint32(frames), next)
			return true
		}
		t.Fatalf("unexpected message type %d", m.typ)
		return true
	})
	el := time.Since(start)
	st := p.dev.Stats()
	t.Logf("%d frames in order and intact in %v (%.0f frames/s, %d laps of a %d-entry %s ring); rx %+v; %d stale frames skipped",
		next, el.Round(time.Millisecond), float64(next)/el.Seconds(), frames/p.rx.Size(), p.rx.Size(),
		p.dev.Info().Model, st.Rx, p.stale)
	require.Zero(t, st.Rx.Errors)
}

// TestGuestTxPacked sends 10,000 frames of mixed sizes; the host checks
// that each arrives in order and intact (gopacket) and reports the count.
func TestGuestTxPacked(t *testing.T) { guestOnly(t); testTx(t, slotPacked) }

// TestGuestTxSplit is TestGuestTxPacked on split rings.
func TestGuestTxSplit(t *testing.T) { guestOnly(t); testTx(t, slotSplit) }

func testTx(t *testing.T, slot int) {
	p := openPeer(t, slot, virtio.Config{})
	p.send(p.ctl(msgExpectReq, frames))
	p.await(msgExpectAck, 10*time.Second)
	seqs := make([]uint32, frames)
	done := make([]bool, frames)
	completed := 0
	reap := func() {
		for {
			n := p.tx.Poll(p.txc)
			for _, c := range p.txc[:n] {
				require.NoError(t, c.Err)
				if c.Context == nil {
					continue // a control frame
				}
				seq := *c.Context.(*uint32)
				require.False(t, done[seq], "frame %d completed twice", seq)
				require.Equal(t, sizeFor(seq), c.Len)
				done[seq] = true
				completed++
			}
			if n < len(p.txc) {
				return
			}
		}
	}
	start := time.Now()
	for seq := uint32(0); seq < frames; {
		seqs[seq] = seq
		err := p.tx.Send(dataFrame(hostMAC, p.mac, p.session, seq), &seqs[seq])
		switch {
		case err == nil:
			seq++
			if seq%32 == 0 {
				require.NoError(t, p.tx.Flush())
			}
		case errors.Is(err, nic.ErrFull):
			require.NoError(t, p.tx.Flush())
			reap()
		default:
			require.NoError(t, err)
		}
	}
	require.NoError(t, p.tx.Flush())
	for deadline := time.Now().Add(30 * time.Second); p.tx.Outstanding() > 0; {
		require.True(t, time.Now().Before(deadline), "every frame completes")
		reap()
	}
	reap()
	el := time.Since(start)
	require.Equal(t, frames, completed, "every frame completed once")
	p.send(p.ctl(msgResultReq))
	r := p.await(msgResult, 30*time.Second)
	t.Logf("sent %d frames in %v (%.0f frames/s); host: %d in order and intact, %d bad; tx %+v",
		frames, el.Round(time.Millisecond), frames/el.Seconds(), r.args[0], r.args[1], p.dev.Stats().Tx)
	require.Equal(t, uint32(frames), r.args[0], "the host received every frame in order")
	require.Zero(t, r.args[1], "no frame arrived damaged")
}

// TestGuestRatePacked measures 64-byte frames per second in each
// direction (logged, not asserted), first busy-polling, then sleeping on
// the interrupt with a threshold (EVENT_IDX aimed that many descriptors
// ahead), which leaves the vCPU halted while QEMU's emulation, on the
// same two host cores, does the work.
func TestGuestRatePacked(t *testing.T) { guestOnly(t); testRate(t, slotPacked) }

// TestGuestRateSplit is TestGuestRatePacked on split rings.
func TestGuestRateSplit(t *testing.T) { guestOnly(t); testRate(t, slotSplit) }

func testRate(t *testing.T, slot int) {
	p := openPeer(t, slot, virtio.Config{})
	for _, sleep := range []bool{false, true} {
		txRate(t, p, sleep)
	}
	for round, sleep := range []bool{false, true} {
		rxRate(t, p, sleep, uint32(round))
	}
}

func mode(sleep bool) string {
	if sleep {
		return "sleeping on MSI-X, threshold 64"
	}
	return "busy polling"
}

// txRate sends as many 64-byte frames as the device takes for benchFor.
func txRate(t *testing.T, p *peer, sleep bool) {
	p.send(p.ctl(msgBenchTxStart))
	p.await(msgBenchTxAck, 10*time.Second)
	st0 := p.dev.Stats().Tx
	f := build(hostMAC, p.mac, msg{typ: msgData, session: p.session}, minFrame)
	sent, rounds, full := 0, 0, 0 // frames; refill rounds, and those that found the ring full
	var stop atomic.Bool
	start := time.Now()
	time.AfterFunc(benchFor, func() { stop.Store(true) }) // no clock reads in the loop
	for !stop.Load() {
		rounds++
		n := 0
		for p.tx.Send(f, nil) == nil {
			n++
		}
		if n == 0 {
			full++
		}
		sent += n
		_ = p.tx.Flush()
		if sleep {
			_, _ = p.tx.SRead(context.Background(), p.txc, len(p.txc), 5*time.Millisecond)
		}
		for p.tx.Poll(p.txc) == len(p.txc) {
		}
	}
	el := time.Since(start)
	for deadline := time.Now().Add(10 * time.Second); p.tx.Outstanding() > 0 && time.Now().Before(deadline); {
		p.tx.Poll(p.txc)
	}
	p.send(p.ctl(msgBenchTxEnd, uint32(sent)))
	r := p.await(msgBenchResult, 10*time.Second)
	hostRate := 0.0
	if r.args[1] > 0 {
		hostRate = float64(r.args[0]-1) / (float64(r.args[1]) / 1e6)
	}
	st := p.dev.Stats().Tx
	t.Logf("%s TX, %s: guest sent %d 64-byte frames in %v = %.0f frames/s; host received %d = %.0f frames/s; "+
		"%d doorbells, %d suppressed, %d interrupts; the ring was full at %.0f%% of %d refills",
		p.dev.Info().Model, mode(sleep), sent, el.Round(time.Millisecond), float64(sent)/el.Seconds(), r.args[0], hostRate,
		st.Notifies-st0.Notifies, st.Suppressed-st0.Suppressed, st.Interrupts-st0.Interrupts,
		100*float64(full)/float64(rounds), rounds)
}

// rxRate has the host send 64-byte frames for benchFor, faster than QEMU
// delivers them, and counts what arrives.
func rxRate(t *testing.T, p *peer, sleep bool, round uint32) {
	st0 := p.dev.Stats().Rx
	p.send(p.ctl(msgBlastReq, uint32(benchFor/time.Millisecond), round))
	got, idle, polls := 0, 0, 0
	var first, last time.Time
	var hostSent, hostUs uint32
	deadline := time.Now().Add(benchFor + 20*time.Second)
	for hostSent == 0 {
		polls++
		var n int
		if sleep {
			n, _ = p.rx.SRead(context.Background(), p.comps, len(p.comps), 2*time.Millisecond)
		} else {
			n = p.rx.Poll(p.comps)
		}
		if n == 0 {
			if idle++; idle%1024 == 0 {
				require.True(t, time.Now().Before(deadline), "the host reports the end of the blast")
			}
			continue
		}
		now := time.Now()
		for _, c := range p.comps[:n] {
			require.NoError(t, c.Err)
			if m, ok := peek(c.Data); ok && m.session == p.session {
				switch {
				case m.typ == msgData:
					if got == 0 {
						first = now
					}
					last = now
					got++
				case m.typ == msgBlastDone && m.args[2] == round:
					hostSent, hostUs = m.args[0], m.args[1]
				}
			}
			_ = p.rx.Repost(c.Buf, nil)
		}
		_ = p.rx.Flush()
	}
	rate := 0.0
	if d := last.Sub(first); d > 0 {
		rate = float64(got-1) / d.Seconds()
	}
	rs := p.dev.Stats().Rx
	t.Logf("%s RX, %s: host sent %d 64-byte frames in %v; guest received %d = %.0f frames/s; "+
		"%d doorbells, %d suppressed, %d interrupts; %.0f%% of %d reads found nothing",
		p.dev.Info().Model, mode(sleep), hostSent, time.Duration(hostUs)*time.Microsecond, got, rate,
		rs.Notifies-st0.Notifies, rs.Suppressed-st0.Suppressed, rs.Interrupts-st0.Interrupts,
		100*float64(idle)/float64(polls), polls)
	require.NotZero(t, got)
}

// TestGuestLinuxTxRate measures the guest Linux virtio_net driver sending
// 64-byte frames from a raw AF_PACKET socket on the same kind of NIC and
// netdev, for comparison with TestGuestRate*.
func TestGuestLinuxTxRate(t *testing.T) {
	guestOnly(t)
	a := addrOf(slotLinux)
	ifname := ""
	ents, err := os.ReadDir("/sys/bus/pci/devices/" + a)
	require.NoError(t, err)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "virtio") {
			nets, err := os.ReadDir("/sys/bus/pci/devices/" + a + "/" + e.Name() + "/net")
			if err == nil && len(nets) > 0 {
				ifname = nets[0].Name()
			}
		}
	}
	require.NotEmpty(t, ifname, "the Linux driver owns an interface on %s", a)
	ifc, err := net.InterfaceByName(ifname)
	require.NoError(t, err)
	proto := int(htons(uint16(etherType)))
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, proto)
	require.NoError(t, err)
	defer unix.Close(fd)
	require.NoError(t, unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(uint16(etherType)), Ifindex: ifc.Index}))
	require.NoError(t, unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 200000}))
	session := uint32(time.Now().UnixNano())&0x7fffffff | 1
	ctl := func(typ uint8, args ...uint32) []byte {
		m := msg{typ: typ, session: session}
		copy(m.args[:], args)
		return build(hostMAC, ifc.HardwareAddr, m, minFrame)
	}
	buf := make([]byte, 2048)
	await := func(send []byte, typ uint8) msg {
		for try := 0; try < 50; try++ {
			if try%5 == 0 {
				_, err := unix.Write(fd, send)
				require.NoError(t, err)
			}
			n, err := unix.Read(fd, buf)
			if err != nil {
				continue
			}
			if m, ok := peek(buf[:n]); ok && m.session == session && m.typ == typ {
				return m
			}
		}
		t.Fatalf("no message %d from the host", typ)
		return msg{}
	}
	await(ctl(msgHello), msgHelloAck)
	await(ctl(msgBenchTxStart), msgBenchTxAck)
	f := build(hostMAC, ifc.HardwareAddr, msg{typ: msgData, session: session}, minFrame)
	sent, refused := 0, 0
	start := time.Now()
	for i := 0; ; i++ {
		if _, err := unix.Write(fd, f); err == nil {
			sent++
		} else {
			refused++ // qdisc full (ENOBUFS): the driver is the bottleneck
		}
		if i%256 == 0 && time.Since(start) >= benchFor {
			break
		}
	}
	el := time.Since(start)
	time.Sleep(200 * time.Millisecond)
	r := await(ctl(msgBenchTxEnd, uint32(sent)), msgBenchResult)
	hostRate := 0.0
	if r.args[1] > 0 {
		hostRate = float64(r.args[0]-1) / (float64(r.args[1]) / 1e6)
	}
	t.Logf("Linux virtio_net TX (AF_PACKET, %s): %d frames written in %v (%d refused); host received %d = %.0f frames/s",
		ifname, sent, el.Round(time.Millisecond), refused, r.args[0], hostRate)
	require.NotZero(t, r.args[0])
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// TestGuestOpen checks what Open reports and refuses, and that a device can
// be opened again after Close.
func TestGuestOpen(t *testing.T) {
	guestOnly(t)
	ctx := context.Background()
	for _, slot := range []int{slotPacked, slotSplit} {
		before := snapshot(t)
		d, err := nic.Open(ctx, addrOf(slot), nic.Config{})
		require.NoError(t, err, "nic.Open finds the virtio driver")
		info := d.Info()
		t.Logf("%s: %s MAC %s MTU %d, %d/%d queue pairs of %d descriptors, %d vectors, features %v",
			info.Address, info.Model, info.MAC, info.MTU, info.QueuePairs, info.MaxQueuePairs, info.QueueSize, info.Vectors, info.Features)
		require.Equal(t, "virtio", info.Driver)
		require.Equal(t, fmt.Sprintf("52:54:00:12:34:%02x", slot), d.MAC().String())
		require.Contains(t, info.Features, "VERSION_1")
		require.Contains(t, info.Features, "ACCESS_PLATFORM")
		require.Contains(t, info.Features, "CTRL_VQ", "mq=on brings the control queue")
		require.Contains(t, info.Features, "MQ")
		require.Equal(t, slot == slotPacked, strings.Contains(info.Model, "packed"))
		l, err := d.Link()
		require.NoError(t, err)
		require.True(t, l.Up)
		require.True(t, l.Reported)
		_, err = d.Rx(1)
		require.ErrorIs(t, err, nic.ErrInvalid)
		require.NoError(t, d.Close())
		require.Equal(t, before, snapshot(t))
		_, err = d.Link()
		require.ErrorIs(t, err, nic.ErrClosed)
		q, err := d.Tx(0)
		require.NoError(t, err)
		require.ErrorIs(t, q.Send(make([]byte, 64), nil), nic.ErrClosed, "a closed device's queues refuse work")
		require.Zero(t, q.Poll(make([]nic.Completion, 4)))
	}
	before := snapshot(t)
	_, err := virtio.Open(ctx, addrOf(slotPacked), virtio.Config{Config: nic.Config{QueuePairs: 2}})
	require.ErrorIs(t, err, nic.ErrNotSupported, "the dgram netdev has one queue pair")
	t.Logf("refused: %v", err)
	_, err = virtio.Open(ctx, addrOf(slotPacked), virtio.Config{Config: nic.Config{BufferSize: 1000}})
	require.ErrorIs(t, err, nic.ErrInvalid)
	_, err = nic.Open(ctx, "0000:00:1f.6", nic.Config{})
	require.Error(t, err)
	t.Logf("refused: %v", err)
	require.Equal(t, before, snapshot(t), "a failed Open releases what it took")
	// The device still works after the refusals.
	d, err := virtio.Open(ctx, addrOf(slotPacked), virtio.Config{Split: true})
	require.NoError(t, err)
	require.False(t, d.Packed(), "Config.Split forces split rings on a packed-capable device")
	require.NoError(t, d.Close())
}

// TestGuestCQPacked binds a NIC's receive and transmit queues to one
// cq.CQ and runs a conversation through it: completions of both kinds come
// from the CQ, a blocking read of the CQ sleeps until the frame's MSI-X
// interrupt (rewired to the CQ's eventfd) wakes it, and 1,000 frames
// arrive in order and intact.
func TestGuestCQPacked(t *testing.T) { guestOnly(t); testCQ(t, slotPacked) }

// TestGuestCQSplit is TestGuestCQPacked on split rings.
func TestGuestCQSplit(t *testing.T) { guestOnly(t); testCQ(t, slotSplit) }

func testCQ(t *testing.T, slot int) {
	before := snapshot(t)
	ctx := context.Background()
	dev, err := virtio.Open(ctx, addrOf(slot), virtio.Config{})
	require.NoError(t, err)
	c, err := cq.New(cq.Attr{Format: cq.FormatData, WaitObj: cq.WaitFD}, cq.Limits{})
	require.NoError(t, err)
	require.ErrorIs(t, dev.BindCQ(c, 1, nic.Recv), nic.ErrInvalid)
	require.NoError(t, dev.BindCQ(c, 0, nic.Recv|nic.Send))
	require.ErrorIs(t, dev.BindCQ(c, 0, nic.Send), nic.ErrInvalid, "a queue feeds one CQ")
	rx, err := dev.RxQueue(0)
	require.NoError(t, err)
	tx, err := dev.TxQueue(0)
	require.NoError(t, err)
	for rx.PostRecv(nil) == nil {
	}
	require.NoError(t, rx.Flush())
	require.Zero(t, rx.Poll(make([]nic.Completion, 4)), "a bound queue is read through its CQ")

	mac := dev.MAC()
	session := uint32(time.Now().UnixNano())&0x7fffffff | 2
	ents := make([]cq.Entry, 64)
	sends := 0
	ctl := func(typ uint8, args ...uint32) []byte {
		m := msg{typ: typ, session: session}
		copy(m.args[:], args)
		return build(hostMAC, mac, m, minFrame)
	}
	// handle reads what the CQ has (blocking up to timeout) and hands
	// received frames of this session to fn; it returns when fn says done.
	handle := func(timeout time.Duration, fn func(f []byte, m msg) bool) {
		deadline := time.Now().Add(timeout)
		for {
			n, err := c.SRead(ctx, ents, 0, time.Until(deadline))
			if errors.Is(err, cq.ErrTimeout) {
				t.Fatalf("nothing from the CQ in %v", timeout)
			}
			require.NoError(t, err)
			done := false
			for _, e := range ents[:n] {
				switch {
				case e.Flags&cq.FlagSend != 0:
					require.Equal(t, uint32(1), e.Queue, "transmitq1 is virtqueue 1")
					sends++
				case e.Flags&cq.FlagRecv != 0:
					require.Equal(t, uint32(0), e.Queue, "receiveq1 is virtqueue 0")
					f, err := rx.Frame(e.Buf, e.Len)
					require.NoError(t, err)
					if m, ok := peek(f); ok && m.session == session {
						done = fn(f, m) || done
					}
					require.NoError(t, rx.Repost(e.Buf, nil))
				default:
					t.Fatalf("entry with flags %v", e.Flags)
				}
			}
			require.NoError(t, rx.Flush())
			if done {
				return
			}
		}
	}
	// The test sends far fewer frames than the transmit ring holds, and
	// handle reaps their completions, so Send always finds room.
	send := func(f []byte) {
		require.NoError(t, tx.Send(f, nil))
		require.NoError(t, tx.Flush())
	}
	want := func(typ uint8) func([]byte, msg) bool {
		return func(_ []byte, m msg) bool { return m.typ == typ }
	}
	send(ctl(msgHello))
	handle(10*time.Second, want(msgHelloAck))

	// Blocking through the CQ: the frame's interrupt wakes the read.
	send(ctl(msgDelayedReq, 300))
	start := time.Now()
	handle(10*time.Second, func(f []byte, m msg) bool {
		require.Equal(t, uint8(msgData), m.typ)
		require.NoError(t, checkData(f, mac, hostMAC, session, 0))
		return true
	})
	el := time.Since(start)
	require.GreaterOrEqual(t, el, 250*time.Millisecond, "the read slept until the frame came")

	const count = 1000
	send(ctl(msgSendReq, count, window))
	next := uint32(0)
	handle(30*time.Second, func(f []byte, m msg) bool {
		switch m.typ {
		case msgData:
			require.Equal(t, next, m.seq, "in order, none missing")
			require.NoError(t, checkData(f, mac, hostMAC, session, next))
			if next++; next%ackEvery == 0 || next == count {
				send(ctl(msgAck, next))
			}
		case msgSendDone:
			return true
		}
		return false
	})
	require.Equal(t, uint32(count), next)
	st := dev.Stats()
	t.Logf("%s through a CQ: woken after %v, %d frames in order, %d send completions; rx %+v",
		dev.Info().Model, el.Round(time.Millisecond), next, sends, st.Rx)
	require.NotZero(t, sends)
	require.Zero(t, st.Rx.Interrupts, "the queue's own eventfd is not signalled while bound")

	require.ErrorIs(t, c.Close(), cq.ErrBusy, "queues are still bound")
	require.NoError(t, dev.Close())
	require.NoError(t, c.Close(), "closing the device unbinds its queues")
	require.Equal(t, before, snapshot(t), "Close returns every fd and mapping")
}
