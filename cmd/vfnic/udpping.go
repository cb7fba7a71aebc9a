package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"syscall"
	"time"
)

// udppingSummary is udpping's -json output.
type udppingSummary struct {
	Server      string  `json:"server"`
	Size        int     `json:"size"`
	Sent        int     `json:"sent"`
	Echoed      int     `json:"echoed"`
	Lost        int     `json:"lost"`
	Corrupted   int     `json:"corrupted"`
	Refused     int     `json:"refused"`
	Interrupted bool    `json:"interrupted"`
	Unanswered  int     `json:"awaiting_at_interrupt"`
	Seconds     float64 `json:"seconds"`
	RTTMinMs    float64 `json:"rtt_min_ms,omitempty"`
	RTTAvgMs    float64 `json:"rtt_avg_ms,omitempty"`
	RTTMaxMs    float64 `json:"rtt_max_ms,omitempty"`
}

// runUDPPing is a client of the kernel's own stack: it sends datagrams to
// an echo server (such as 'vfnic echo' on another NIC) and checks that each
// comes back intact. The demo uses it from the guest's Linux side.
// Ctrl-C ends it with its summary; the datagram then awaiting its echo is
// not counted as lost. An ICMP port unreachable (ECONNREFUSED) counts that
// datagram as refused and the run goes on.
func runUDPPing(ctx context.Context, args []string, o stdio) error {
	fs := newFlags("udpping", "[flags] IP:PORT")
	count := fs.Int("count", 10, "datagrams to send")
	size := fs.Int("size", 64, "payload bytes (8 to 65507)")
	timeout := fs.Duration("timeout", time.Second, "how long to wait for each echo")
	interval := fs.Duration("interval", 100*time.Millisecond, "pause between datagrams")
	asJSON := fs.Bool("json", false, "print the summary as one JSON object on stdout; human lines go to stderr")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("%w: name the echo server as IP:PORT", errUsage)
	}
	switch {
	case *count <= 0:
		return fmt.Errorf("%w: -count %d is not positive", errUsage, *count)
	case *size < 8 || *size > 65507:
		return fmt.Errorf("%w: -size %d outside [8, 65507]", errUsage, *size)
	case *timeout <= 0:
		return fmt.Errorf("%w: -timeout %v is not positive", errUsage, *timeout)
	}
	raddr, err := net.ResolveUDPAddr("udp4", fs.Arg(0))
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	out := o.out
	if *asJSON {
		out = o.err
	}
	conn, err := net.DialUDP("udp4", nil, raddr)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()

	msg := make([]byte, *size)
	reply := make([]byte, 65536)
	var rtts []time.Duration
	s := udppingSummary{Server: raddr.String(), Size: *size}
	begin := time.Now()
	refused := func(i int, err error) bool {
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return false
		}
		s.Refused++
		fmt.Fprintf(out, "udpping: seq %d: port unreachable (%v)\n", i, err)
		return true
	}
	var fatal error
send:
	for i := 0; i < *count && ctx.Err() == nil; i++ {
		binary.BigEndian.PutUint64(msg, uint64(i))
		for j := 8; j < len(msg); j++ {
			msg[j] = byte(i + j)
		}
		start := time.Now()
		if _, err := conn.Write(msg); err != nil {
			if refused(i, err) {
				// The refusal was for an earlier datagram: this one was
				// not sent.
				continue
			}
			fatal = err
			break
		}
		s.Sent++
		_ = conn.SetReadDeadline(start.Add(*timeout))
		for {
			n, err := conn.Read(reply)
			if ctx.Err() != nil {
				s.Interrupted, s.Unanswered = true, 1 // Ctrl-C is not loss
				break send
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				s.Lost++
				fmt.Fprintf(out, "udpping: seq %d: no echo within %v\n", i, *timeout)
				break
			}
			if refused(i, err) {
				break
			}
			if err != nil {
				fatal = err
				break send
			}
			if n >= 8 && binary.BigEndian.Uint64(reply) < uint64(i) {
				continue // a late echo of an earlier datagram
			}
			rtt := time.Since(start)
			if !bytes.Equal(reply[:n], msg) {
				s.Corrupted++
				fmt.Fprintf(out, "udpping: seq %d: echo of %d bytes differs from what was sent\n", i, n)
				break
			}
			rtts = append(rtts, rtt)
			fmt.Fprintf(out, "udpping: %d bytes from %s: seq=%d time=%.3f ms\n", n, raddr, i, ms(rtt))
			break
		}
		if i+1 < *count {
			select {
			case <-ctx.Done():
			case <-time.After(*interval):
			}
		}
	}
	s.Interrupted = s.Interrupted || ctx.Err() != nil
	s.Echoed = len(rtts)
	s.Seconds = time.Since(begin).Seconds()
	fmt.Fprintf(out, "udpping: %d sent, %d echoed intact, %d lost, %d corrupted, %d refused", s.Sent, s.Echoed, s.Lost, s.Corrupted, s.Refused)
	if len(rtts) > 0 {
		slices.Sort(rtts)
		var sum time.Duration
		for _, r := range rtts {
			sum += r
		}
		s.RTTMinMs, s.RTTAvgMs, s.RTTMaxMs = ms(rtts[0]), ms(sum/time.Duration(len(rtts))), ms(rtts[len(rtts)-1])
		fmt.Fprintf(out, ", rtt min/avg/max %.3f/%.3f/%.3f ms", s.RTTMinMs, s.RTTAvgMs, s.RTTMaxMs)
	}
	if s.Interrupted {
		fmt.Fprintf(out, ", interrupted (%d awaiting an echo, not counted as lost)", s.Unanswered)
	}
	fmt.Fprintln(out)
	if *asJSON {
		if err := json.NewEncoder(o.out).Encode(s); err != nil && fatal == nil {
			fatal = err
		}
	}
	if fatal != nil {
		return fatal
	}
	if bad := s.Lost + s.Corrupted + s.Refused; bad > 0 {
		return fmt.Errorf("%d of %d datagrams sent not echoed intact", bad, s.Sent)
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
