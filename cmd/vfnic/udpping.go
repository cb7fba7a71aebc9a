package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"time"
)

// runUDPPing is a client of the kernel's own stack: it sends datagrams to
// an echo server (such as 'vfnic echo' on another NIC) and checks that each
// comes back intact. The demo uses it from the guest's Linux side.
func runUDPPing(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlags("udpping", "[flags] IP:PORT")
	count := fs.Int("count", 10, "datagrams to send")
	size := fs.Int("size", 64, "payload bytes (8 to 1472)")
	timeout := fs.Duration("timeout", time.Second, "how long to wait for each echo")
	interval := fs.Duration("interval", 100*time.Millisecond, "pause between datagrams")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("%w: name the echo server as IP:PORT", errUsage)
	}
	if *count <= 0 || *size < 8 || *size > 1472 || *timeout <= 0 {
		return fmt.Errorf("%w: -count > 0, -size 8..1472, -timeout > 0", errUsage)
	}
	raddr, err := net.ResolveUDPAddr("udp4", fs.Arg(0))
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	conn, err := net.DialUDP("udp4", nil, raddr)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()

	msg := make([]byte, *size)
	reply := make([]byte, 2048)
	var rtts []time.Duration
	lost, bad := 0, 0
	for i := 0; i < *count && ctx.Err() == nil; i++ {
		binary.BigEndian.PutUint64(msg, uint64(i))
		for j := 8; j < len(msg); j++ {
			msg[j] = byte(i + j)
		}
		start := time.Now()
		if _, err := conn.Write(msg); err != nil {
			return err
		}
		_ = conn.SetReadDeadline(start.Add(*timeout))
		for {
			n, err := conn.Read(reply)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				lost++
				fmt.Fprintf(out, "udpping: seq %d: no echo within %v\n", i, *timeout)
				break
			}
			if err != nil {
				return err
			}
			if n >= 8 && binary.BigEndian.Uint64(reply) < uint64(i) {
				continue // a late echo of an earlier datagram
			}
			rtt := time.Since(start)
			if !bytes.Equal(reply[:n], msg) {
				bad++
				fmt.Fprintf(out, "udpping: seq %d: echo of %d bytes differs from what was sent\n", i, n)
				break
			}
			rtts = append(rtts, rtt)
			fmt.Fprintf(out, "udpping: %d bytes from %s: seq=%d time=%.3f ms\n", n, raddr, i, float64(rtt.Microseconds())/1000)
			break
		}
		time.Sleep(*interval)
	}
	fmt.Fprintf(out, "udpping: %d sent, %d echoed intact, %d lost, %d corrupted", *count, len(rtts), lost, bad)
	if len(rtts) > 0 {
		slices.Sort(rtts)
		var sum time.Duration
		for _, r := range rtts {
			sum += r
		}
		fmt.Fprintf(out, ", rtt min/avg/max %.3f/%.3f/%.3f ms", ms(rtts[0]), ms(sum/time.Duration(len(rtts))), ms(rtts[len(rtts)-1]))
	}
	fmt.Fprintln(out)
	if lost > 0 || bad > 0 {
		return fmt.Errorf("%d of %d datagrams not echoed intact", lost+bad, *count)
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
