package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/vfnic/vfnic/nic"
)

func runPktgen(ctx context.Context, args []string, o stdio) error {
	fs := newFlags("pktgen", "[flags] PCI-ADDR")
	var df deviceFlags
	df.register(fs)
	count := fs.Int("count", 100000, "frames to send (0: until -duration or interrupted; default 0 when -duration is given)")
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
	countSet := false
	fs.Visit(func(f *flag.Flag) { countSet = countSet || f.Name == "count" })
	if !countSet && df.duration > 0 {
		*count = 0 // -duration alone bounds the run
	}
	if *size < minFrame || *size > 65535 {
		return fmt.Errorf("%w: -size %d outside [%d, 65535]", errUsage, *size, minFrame)
	}
	if *count < 0 || (*count == 0 && df.duration == 0) {
		return fmt.Errorf("%w: -count must be positive, or 0 with -duration", errUsage)
	}
	if *rate < 0 {
		return fmt.Errorf("%w: -rate %g is negative", errUsage, *rate)
	}
	if *vlan < -1 || *vlan > 4094 {
		return fmt.Errorf("%w: -vlan %d outside [0, 4094]", errUsage, *vlan)
	}
	dst, err := net.ParseMAC(*dstMAC)
	if err != nil {
		return fmt.Errorf("%w: -dst-mac: %v", errUsage, err)
	}
	sip, err1 := netip.ParseAddr(*srcIP)
	dip, err2 := netip.ParseAddr(*dstIP)
	if err1 != nil || err2 != nil || !sip.Is4() || !dip.Is4() {
		return fmt.Errorf("%w: -src-ip and -dst-ip need IPv4 addresses", errUsage)
	}
	if *port <= 0 || *port > 65535 {
		return fmt.Errorf("%w: -port %d outside [1, 65535]", errUsage, *port)
	}
	dev, err := df.openOne(ctx, fs, nic.Config{})
	if err != nil {
		return err
	}
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
	var sent, failed, full uint64
	p := newProgress(out, dev, df.interval, func() string {
		return fmt.Sprintf("queued %d, send errors %d, ring-full waits %d", sent, failed, full)
	})
	fmt.Fprintf(out, "pktgen: sending %d-byte frames to %s (%s -> %s:%d%s) %s, %s\n", *size, dst, sip, dip, *port,
		vlanNote(*vlan), rateNote(*rate, *size), stopNote(*count, df.duration))
	ctx, cancel := df.withDuration(ctx)
	defer cancel()
	start := time.Now()
	txc := make([]nic.Completion, 256)
	for (*count == 0 || sent < uint64(*count)) && ctx.Err() == nil {
		if *rate > 0 {
			// Pace: send only what is due by now; sleep until the next
			// frame is, having handed the device what was queued.
			dueAt := start.Add(time.Duration(float64(sent) / *rate * float64(time.Second)))
			if wait := time.Until(dueAt); wait > 0 {
				if err := tx.Flush(); err != nil {
					return err
				}
				failed += uint64(reapTx(tx, txc))
				p.tick()
				select {
				case <-ctx.Done():
				case <-time.After(wait):
				}
				continue
			}
		}
		// Each frame carries its sequence number in the UDP payload.
		binary.BigEndian.PutUint64(frame[seqOff:], sent)
		err := tx.Send(frame, nil)
		if errors.Is(err, nic.ErrFull) {
			full++
			if err := tx.Flush(); err != nil {
				return err
			}
			failed += uint64(reapTx(tx, txc))
			if tx.Outstanding() >= tx.Size() {
				// Ring still full: sleep until the device completes some.
				n, err := tx.SRead(ctx, txc, 1, -1)
				failed += uint64(failures(txc[:n]))
				if err != nil && ctx.Err() == nil {
					return err
				}
			}
			continue
		}
		if err != nil {
			return err
		}
		sent++
		if sent%32 == 0 {
			if err := tx.Flush(); err != nil {
				return err
			}
			failed += uint64(reapTx(tx, txc))
			p.tick()
		}
	}
	if err := tx.Flush(); err != nil {
		return err
	}
	// Wait (bounded) for the last completions so the counters are final.
	for tx.Outstanding() > 0 {
		n, err := tx.SRead(context.Background(), txc, tx.Outstanding(), 2*time.Second)
		failed += uint64(failures(txc[:n]))
		if err != nil {
			fmt.Fprintf(out, "pktgen: %d sends not completed: %v\n", tx.Outstanding(), err)
			break
		}
	}
	return p.summary("pktgen", df.jsonOut(o), map[string]any{
		"frame_size": *size, "vlan": *vlan, "rate_pps": *rate, "count": *count, "duration_seconds": df.duration.Seconds(),
		"queued": sent, "send_errors": failed, "ring_full_waits": full})
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
	default:
		return fmt.Sprintf("for %v", d)
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
