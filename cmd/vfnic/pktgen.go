package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/vfnic/vfnic/lcore"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/pci"
)

func runPktgen(ctx context.Context, args []string, o stdio) error {
	fs := newFlags("pktgen", "[flags] PCI-ADDR")
	var df deviceFlags
	df.register(fs)
	count := fs.Int("count", 0, "frames to send (0: until -duration or interrupted)")
	size := fs.Int("size", 64, "frame size in bytes without FCS (60 up to the device's largest frame, MTU+22)")
	rate := fs.Float64("rate", 0, "frames per second (0: as fast as the NIC takes them)")
	vlan := fs.Int("vlan", -1, "802.1Q VLAN ID to tag frames with (-1: untagged)")
	dstMAC := fs.String("dst-mac", "ff:ff:ff:ff:ff:ff", "destination MAC")
	srcIP := fs.String("src-ip", "10.0.0.1", "source IPv4 address")
	dstIP := fs.String("dst-ip", "10.0.0.2", "destination IPv4 address")
	port := fs.Int("port", 9, "UDP destination port (9: discard)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *size < minFrame || *size > 65535 {
		return fmt.Errorf("%w: -size %d outside [%d, 65535]", errUsage, *size, minFrame)
	}
	// The device flags first (parse has refused a negative -duration).
	if err := df.check(); err != nil {
		return err
	}
	switch {
	case *count < 0:
		return fmt.Errorf("%w: -count %d is negative", errUsage, *count)
	case math.IsNaN(*rate) || math.IsInf(*rate, 0):
		// NaN passes every comparison, and the pacing would overflow.
		return fmt.Errorf("%w: -rate %g is not a finite number", errUsage, *rate)
	case *rate < 0:
		return fmt.Errorf("%w: -rate %g is negative", errUsage, *rate)
	}
	if *vlan < -1 || *vlan > 4094 {
		return fmt.Errorf("%w: -vlan %d outside [0, 4094]", errUsage, *vlan)
	}
	dst, err := net.ParseMAC(*dstMAC)
	if err != nil {
		return fmt.Errorf("%w: -dst-mac: %v", errUsage, err)
	}
	if len(dst) != 6 { // ParseMAC takes EUI-64 and InfiniBand addresses too
		return fmt.Errorf("%w: -dst-mac %q is not a 6-byte Ethernet address", errUsage, *dstMAC)
	}
	sip, err1 := netip.ParseAddr(*srcIP)
	dip, err2 := netip.ParseAddr(*dstIP)
	if err1 != nil || err2 != nil || !sip.Is4() || !dip.Is4() {
		return fmt.Errorf("%w: -src-ip and -dst-ip need IPv4 addresses", errUsage)
	}
	if *port <= 0 || *port > 65535 {
		return fmt.Errorf("%w: -port %d outside [1, 65535]", errUsage, *port)
	}
	if fs.NArg() == 1 {
		// A size the kernel's driver of the NIC refuses is refused before
		// the NIC is taken from it.
		if a, err := pci.ParseAddress(fs.Arg(0)); err == nil {
			if max, ok := kernelMaxFrame(a); ok && *size > max {
				return fmt.Errorf("%w: -size %d: longer than any frame %s takes (its kernel driver's largest MTU makes frames of up to %d bytes)",
					errUsage, *size, a, max)
			}
		}
	}
	core, dev, err := df.open(ctx, fs, nic.Config{})
	if err != nil {
		return err
	}
	defer core.Close() // after the device
	defer dev.Close()
	out := df.human(o)
	describe(out, dev)
	tx, err := dev.Tx(0)
	if err != nil {
		return err
	}
	if *size > tx.MaxFrame() {
		return fmt.Errorf("%w: -size %d: frame of %d bytes outside [%d, %d] for %s (MTU %d)",
			errUsage, *size, *size, minFrame, tx.MaxFrame(), dev.Info().Address, dev.Info().MTU)
	}
	frame, seqOff, err := udpFrame(dev.MAC(), dst, sip, dip, uint16(*port), *size, *vlan)
	if err != nil {
		return err
	}
	g := &pktgen{tx: tx, frame: frame, seqOff: seqOff, count: uint64(*count), rate: *rate}
	p := newProgress(out, dev, df.interval, g.line)
	fmt.Fprintf(out, "pktgen: sending %d-byte frames to %s (%s -> %s:%d%s) %s, %s, %s\n", *size, dst, sip, dip, *port,
		vlanNote(*vlan), rateNote(*rate, *size), stopNote(*count, df.duration), coreNote(core))
	ctx, cancel := df.withDuration(ctx)
	defer cancel()
	if err := g.run(ctx, core, p); err != nil {
		return removed(err, tx)
	}
	// Wait (bounded) for the last completions so the counters are final.
	txc := make([]nic.Completion, 256)
	for tx.Outstanding() > 0 {
		n, err := tx.SRead(context.Background(), txc, tx.Outstanding(), 2*time.Second)
		g.failed += uint64(failures(txc[:n]))
		if err != nil {
			fmt.Fprintf(out, "pktgen: %d sends not completed: %v\n", tx.Outstanding(), err)
			break
		}
	}
	return p.summary("pktgen", df.jsonOut(o), map[string]any{
		"frame_size": *size, "vlan": *vlan, "rate_pps": *rate, "count": *count, "duration_seconds": df.duration.Seconds(),
		"queued": g.sent, "send_errors": g.failed, "ring_full_waits": g.full})
}

// pktgen is pktgen's sending loop: a Func of a polling core that queues
// up to a batch of frames per round (the core rings the doorbell once per
// round), with the transmit queue's completions counted by the core.
type pktgen struct {
	tx     nic.TxQueue
	frame  []byte
	seqOff int     // where each frame's sequence number goes
	count  uint64  // frames to send, 0 for no limit
	rate   float64 // frames per second, 0 for as fast as the NIC takes them

	// Written on the core's thread; read by the progress line there and
	// by the summary once the core has stopped.
	sent, failed, full uint64
	blocked            bool // the last Send found the ring full
}

func (g *pktgen) line() string {
	return fmt.Sprintf("queued %d, send errors %d, ring-full waits %d", g.sent, g.failed, g.full)
}

// run sends on core until count frames are queued, ctx ends, or a send
// fails. It flushes what it queued; completions may still be outstanding.
func (g *pktgen) run(ctx context.Context, core *lcore.Core, p *progress) error {
	ctx, done := context.WithCancel(ctx)
	defer done()
	// A sleeping core wakes only for interrupts: when the next frame is
	// not due yet, a timer wakes it then. A busy core looks by itself.
	var timer *time.Timer
	var timerAt time.Time
	if g.rate > 0 && core.Config().Mode != lcore.Busy {
		timer = time.AfterFunc(time.Hour, func() { _ = core.Wake() })
		timer.Stop()
		defer timer.Stop()
	}
	err := core.AddQueue(g.tx, func(_ nic.Queue, batch []nic.Completion) error {
		g.failed += uint64(failures(batch))
		return nil
	})
	if err != nil {
		return err
	}
	var start time.Time
	err = core.AddFunc(func() (int, error) {
		if g.count > 0 && g.sent >= g.count {
			done() // the core finishes this round (its doorbell) and stops
			return 0, nil
		}
		limit := uint64(lcore.DefaultBatch)
		if g.count > 0 {
			limit = min(limit, g.count-g.sent)
		}
		if g.rate > 0 {
			if start.IsZero() {
				start = time.Now()
			}
			// Frame i is due i/rate seconds after the start.
			due := uint64(time.Since(start).Seconds()*g.rate) + 1
			if due <= g.sent {
				if at := start.Add(time.Duration(float64(g.sent) / g.rate * float64(time.Second))); timer != nil && at != timerAt {
					timerAt = at
					timer.Reset(time.Until(at))
				}
				return 0, nil
			}
			limit = min(limit, due-g.sent)
		}
		n := 0
		for ; uint64(n) < limit; n++ {
			// Each frame carries its sequence number in the UDP payload.
			binary.BigEndian.PutUint64(g.frame[g.seqOff:], g.sent)
			err := g.tx.Send(g.frame, nil)
			if errors.Is(err, nic.ErrFull) {
				// Counted once per wait: the core polls the ring again
				// (or sleeps on its interrupt) until the device completes some.
				if !g.blocked {
					g.full++
					g.blocked = true
				}
				break
			}
			if err != nil {
				return n, err
			}
			g.blocked = false
			g.sent++
		}
		return n, nil
	})
	if err != nil {
		return err
	}
	if err := runCore(ctx, core, p); err != nil {
		return err
	}
	return g.tx.Flush()
}

// coreNote says how the polling core runs.
func coreNote(c *lcore.Core) string {
	cfg := c.Config()
	if cfg.CPU == lcore.AnyCPU {
		return fmt.Sprintf("polling in %s mode on a thread of its own (not pinned)", cfg.Mode)
	}
	return fmt.Sprintf("polling in %s mode on a thread pinned to CPU %d", cfg.Mode, cfg.CPU)
}

func vlanNote(vlan int) string {
	if vlan < 0 {
		return ""
	}
	return fmt.Sprintf(", VLAN %d", vlan)
}

// rateNote says which rate pktgen runs at.
func rateNote(rate float64, size int) string {
	if rate <= 0 {
		return "as fast as the NIC takes them"
	}
	return fmt.Sprintf("at %.0f pps (%.2f Mbit/s)", rate, rate*float64(size)*8/1e6)
}

// stopNote says what ends the run.
func stopNote(count int, d time.Duration) string {
	switch {
	case count > 0 && d > 0:
		return fmt.Sprintf("until %d frames are sent or %v passes, whichever comes first", count, d)
	case count > 0:
		return fmt.Sprintf("until %d frames are sent", count)
	case d > 0:
		return fmt.Sprintf("for %v", d)
	default:
		return "until interrupted (Ctrl-C)"
	}
}

// udpFrame builds a UDP/IPv4 frame of size bytes and returns where its
// 8-byte sequence number sits.
func udpFrame(src, dst net.HardwareAddr, sip, dip netip.Addr, port uint16, size, vlan int) ([]byte, int, error) {
	headers := 14 + 20 + 8
	if vlan >= 0 {
		headers += 4
	}
	if size < headers+8 {
		return nil, 0, fmt.Errorf("%w: frame of %d bytes cannot hold a sequence number", errUsage, size)
	}
	s4, d4 := sip.As4(), dip.As4()
	eth := layers.Ethernet{SrcMAC: src, DstMAC: dst, EthernetType: layers.EthernetTypeIPv4}
	ip := layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: s4[:], DstIP: d4[:]}
	udp := layers.UDP{SrcPort: 9000, DstPort: layers.UDPPort(port)}
	_ = udp.SetNetworkLayerForChecksum(&ip)
	buf := gopacket.NewSerializeBuffer()
	ls := []gopacket.SerializableLayer{&eth, &ip, &udp, gopacket.Payload(make([]byte, size-headers))}
	if vlan >= 0 {
		eth.EthernetType = layers.EthernetTypeDot1Q
		tag := layers.Dot1Q{VLANIdentifier: uint16(vlan), Type: layers.EthernetTypeIPv4}
		ls = append([]gopacket.SerializableLayer{&eth, &tag}, ls[1:]...)
	}
	err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...)
	if err != nil {
		return nil, 0, err
	}
	b := buf.Bytes()
	// The UDP checksum goes back to 0 (allowed over IPv4): the sequence
	// number changes in place for every frame.
	binary.BigEndian.PutUint16(b[headers-2:], 0)
	return b, headers, nil
}
