package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/vfnic/vfnic/nic"
)

func runPktgen(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlags("pktgen", "[flags] PCI-ADDR")
	var df deviceFlags
	df.register(fs)
	count := fs.Int("count", 100000, "frames to send (0: until -duration or interrupted)")
	size := fs.Int("size", 64, "frame size in bytes without FCS (60 to 1514)")
	dstMAC := fs.String("dst-mac", "ff:ff:ff:ff:ff:ff", "destination MAC")
	srcIP := fs.String("src-ip", "10.0.0.1", "source IPv4 address")
	dstIP := fs.String("dst-ip", "10.0.0.2", "destination IPv4 address")
	port := fs.Int("port", 9, "UDP destination port (9: discard)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *size < minFrame || *size > nic.MaxFrame {
		return fmt.Errorf("%w: -size %d outside %d..%d", errUsage, *size, minFrame, nic.MaxFrame)
	}
	if *count < 0 || (*count == 0 && df.duration == 0) {
		return fmt.Errorf("%w: -count must be positive, or 0 with -duration", errUsage)
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
		return fmt.Errorf("%w: -port %d", errUsage, *port)
	}
	dev, err := df.openOne(ctx, fs)
	if err != nil {
		return err
	}
	defer dev.Close()
	ctx, cancel := df.withDuration(ctx)
	defer cancel()
	describe(out, dev)
	tx, err := dev.Tx(0)
	if err != nil {
		return err
	}
	frame, seqOff, err := udpFrame(dev.MAC(), dst, sip, dip, uint16(*port), *size)
	if err != nil {
		return err
	}
	var sent, failed, full uint64
	p := newProgress(out, dev, df.interval, func() string {
		return fmt.Sprintf("queued %d, send errors %d, ring-full waits %d", sent, failed, full)
	})
	fmt.Fprintf(out, "pktgen: sending %d frames of %d bytes to %s (%s -> %s:%d)\n", *count, *size, dst, sip, dip, *port)
	txc := make([]nic.Completion, 256)
	for (*count == 0 || sent < uint64(*count)) && ctx.Err() == nil {
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
	p.summary("pktgen")
	return nil
}

// udpFrame builds a UDP/IPv4 frame of size bytes and returns where its
// 8-byte sequence number sits.
func udpFrame(src, dst net.HardwareAddr, sip, dip netip.Addr, port uint16, size int) ([]byte, int, error) {
	const headers = 14 + 20 + 8
	if size < headers+8 {
		return nil, 0, fmt.Errorf("%w: frame of %d bytes cannot hold a sequence number", errUsage, size)
	}
	s4, d4 := sip.As4(), dip.As4()
	eth := layers.Ethernet{SrcMAC: src, DstMAC: dst, EthernetType: layers.EthernetTypeIPv4}
	ip := layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: s4[:], DstIP: d4[:]}
	udp := layers.UDP{SrcPort: 9000, DstPort: layers.UDPPort(port)}
	_ = udp.SetNetworkLayerForChecksum(&ip)
	buf := gopacket.NewSerializeBuffer()
	err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, &eth, &ip, &udp,
		gopacket.Payload(make([]byte, size-headers)))
	if err != nil {
		return nil, 0, err
	}
	b := buf.Bytes()
	// The UDP checksum goes back to 0 (allowed over IPv4): the sequence
	// number changes in place for every frame.
	binary.BigEndian.PutUint16(b[headers-2:], 0)
	return b, headers, nil
}
