package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cmd/vfnic/internal/pcapfilter"
	"github.com/vfnic/vfnic/lcore"
	"github.com/vfnic/vfnic/lcore/lcoretest"
)

var allModes = []lcore.Mode{lcore.Busy, lcore.Adaptive, lcore.Interrupt}

// TestCoreFlagErrors: a bad -cpu or -mode is a usage error (exit 2) that
// names the value, for every traffic command, before any device is
// touched.
func TestCoreFlagErrors(t *testing.T) {
	allowed, err := lcore.AllowedCPUs()
	require.NoError(t, err)
	notAllowed := allowed[len(allowed)-1] + 1 // beyond the last CPU this process may use
	for _, cmd := range [][]string{
		{"pktgen"},
		{"echo", "-ip", "10.0.0.1"},
		{"capture", "-w", "/dev/null"},
		{"sink"},
	} {
		for _, tc := range []struct {
			flags []string
			want  string
		}{
			{[]string{"-cpu", "-2"}, "-cpu -2: CPUs are numbered from 0"},
			{[]string{"-cpu", "99999"}, "-cpu 99999: not a CPU this process may run on"},
			{[]string{"-cpu", fmt.Sprint(notAllowed)}, fmt.Sprintf("-cpu %d: not a CPU this process may run on (this process may run on %v)", notAllowed, allowed)},
			{[]string{"-cpu", "x"}, `invalid value "x" for flag -cpu`},
			{[]string{"-mode", "fast"}, `invalid value "fast" for flag -mode: want busy, adaptive or interrupt`},
			{[]string{"-mode", ""}, `invalid value "" for flag -mode`},
			{[]string{"-idle", "-1ms"}, "-idle -1ms is negative"},
			{[]string{"-idle", "soon"}, `invalid value "soon" for flag -idle`},
			{[]string{"-batch", "-3"}, "-batch -3: not a count from 0 to 32768"},
			{[]string{"-batch", "1000000000"}, "-batch 1000000000: not a count from 0 to 32768"},
		} {
			args := append(append(append([]string{}, cmd...), "0000:7f:1f.7"), tc.flags...)
			code, out, errw := runCLI(args...)
			require.Equal(t, exitUsage, code, "%v: %s", args, errw)
			require.Contains(t, errw, tc.want, "%v", args)
			require.NotContains(t, errw, "not found", "%v: refused before the device is looked up", args)
			require.Empty(t, out)
		}
	}
}

// TestCoreFlagsAccepted: good -cpu and -mode values get as far as opening
// the (missing) device, flags before or after the address; help shows
// both with the default mode.
func TestCoreFlagsAccepted(t *testing.T) {
	allowed, err := lcore.AllowedCPUs()
	require.NoError(t, err)
	cpu := fmt.Sprint(allowed[0])
	for _, args := range [][]string{
		{"pktgen", "-cpu", cpu, "-mode", "busy", "0000:7f:1f.7"},
		{"pktgen", "0000:7f:1f.7", "-mode=interrupt", "-cpu", "-1"},
		{"echo", "-ip", "10.0.0.1", "0000:7f:1f.7", "-mode", "adaptive", "-cpu", cpu},
		{"capture", "-w", "/dev/null", "-mode", "interrupt", "0000:7f:1f.7"},
		{"sink", "0000:7f:1f.7", "-mode", "busy", "-cpu", cpu, "-p"},
		{"sink", "0000:7f:1f.7", "-mode", "adaptive", "-idle", "300us", "-batch", "64"},
		{"pktgen", "-queues", "4", "0000:7f:1f.7"},
		{"capture", "0000:7f:1f.7", "-queues=2", "udp"},
		{"echo", "-ip", "10.0.0.1", "-queues", "3", "0000:7f:1f.7"},
		{"fwd", "-queues", "2", "0000:7f:1f.7", "0000:7f:1f.6"},
	} {
		code, _, errw := runCLI(args...)
		require.Equal(t, exitFailure, code, "%v: %s", args, errw)
		require.Contains(t, errw, "0000:7f:1f.7", "%v", args)
		require.Contains(t, errw, "not found", "%v", args)
	}
	for _, cmd := range []string{"pktgen", "echo", "capture", "sink"} {
		code, out, errw := runCLI("help", cmd)
		require.Zero(t, code, errw)
		require.Contains(t, out, "-cpu N\n")
		require.Contains(t, out, "pin the polling thread to CPU N (-1: not pinned")
		require.Contains(t, out, "-mode busy|adaptive|interrupt\n")
		require.Contains(t, out, "(default adaptive)")
		require.Contains(t, out, "before it sleeps (0: "+lcore.DefaultIdleInterval.String()+")")
	}
	for _, cmd := range []string{"pktgen", "echo", "capture", "sink", "fwd"} {
		code, out, errw := runCLI("help", cmd)
		require.Zero(t, code, errw)
		require.Contains(t, out, "-queues int\n", cmd)
		require.Contains(t, out, "queue pairs, each polled by its own core (with -cpu N, queue i's on CPU N+i)", cmd)
		require.Contains(t, out, "(default 1)", cmd)
	}
}

// newTestCore returns an unpinned core in mode, closed with the test.
func newTestCore(t *testing.T, mode lcore.Mode) *lcore.Core {
	t.Helper()
	c, err := lcore.New(lcore.Config{CPU: lcore.AnyCPU, Mode: mode})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func newTestQueue(t *testing.T) *lcoretest.Queue {
	t.Helper()
	q, err := lcoretest.New(0, 256)
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	return q
}

// TestPktgenOnCore: in every mode pktgen queues exactly -count frames,
// numbered, and the summary carries the core's mode, CPU and counters.
func TestPktgenOnCore(t *testing.T) {
	for _, mode := range allModes {
		t.Run(mode.String(), func(t *testing.T) {
			tx := newTestQueue(t)
			core := newTestCore(t, mode)
			g := &pktgen{tx: tx, src: &seqFrame{frame: make([]byte, 64), seqOff: 42}, count: 300, limited: true}
			var human, js bytes.Buffer
			p := newProgress(&human, &fakeDevice{}, 0, g.line)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			require.NoError(t, g.run(ctx, core, p))
			require.NoError(t, ctx.Err(), "stopped by the count, not the timeout")
			require.EqualValues(t, 300, g.sent.Load())
			require.EqualValues(t, 300, tx.Counters().Posts)
			require.NotZero(t, tx.Counters().Flushes, "the core rang the doorbell")
			require.Equal(t, uint64(299), binary.BigEndian.Uint64(g.src.(*seqFrame).frame[42:]), "the last frame carries sequence number 299")

			require.NoError(t, p.summary("pktgen", &js, nil))
			require.Contains(t, human.String(), fmt.Sprintf("pktgen: polling core %s mode, not pinned: ", mode))
			var s trafficSummary
			require.NoError(t, json.Unmarshal(js.Bytes(), &s), js.String())
			require.NotNil(t, s.Core)
			require.Equal(t, mode.String(), s.Core.Mode)
			require.Equal(t, -1, s.Core.CPU)
			require.Positive(t, s.Core.Polls)
			require.LessOrEqual(t, s.Core.EmptyPolls, s.Core.Polls)
			t.Logf("%s", human.String())
		})
	}
}

// TestPktgenRateOnSleepingCore: with -rate, a core that sleeps between
// frames (interrupt and adaptive modes; the test queue raises no send
// completions) is woken by pktgen's timer when the next frame is due:
// the run ends, paced, and the core did sleep.
func TestPktgenRateOnSleepingCore(t *testing.T) {
	for _, mode := range []lcore.Mode{lcore.Interrupt, lcore.Adaptive} {
		t.Run(mode.String(), func(t *testing.T) {
			tx := newTestQueue(t)
			core := newTestCore(t, mode)
			g := &pktgen{tx: tx, src: &seqFrame{frame: make([]byte, 64), seqOff: 42}, count: 20, limited: true, rate: 500}
			p := newProgress(io.Discard, &fakeDevice{}, 0, g.line)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			start := time.Now()
			require.NoError(t, g.run(ctx, core, p))
			took := time.Since(start)
			require.NoError(t, ctx.Err(), "stopped by the count, not the timeout")
			require.EqualValues(t, 20, g.sent.Load())
			require.GreaterOrEqual(t, took, 19*time.Second/500, "paced: frame 19 is due 38 ms in")
			// Woken only by runCore's 100 ms housekeeping, 20 frames would
			// take about 2 s.
			require.Less(t, took, time.Second, "the timer wakes the core when a frame is due")
			st := core.Stats()
			t.Logf("%v: 20 frames at 500 pps in %v; core %+v", mode, took, st)
			require.Positive(t, st.Sleeps, "the core slept between frames")
			require.Positive(t, st.Wakeups)
		})
	}
}

// TestCaptureOnCore: in every mode capture writes exactly -count frames
// to the pcap and stops, including frames that arrive while the core
// sleeps (the queue's interrupt wakes it).
func TestCaptureOnCore(t *testing.T) {
	for _, mode := range allModes {
		t.Run(mode.String(), func(t *testing.T) {
			rx := newTestQueue(t)
			core := newTestCore(t, mode)
			var pcap bytes.Buffer
			bw := bufio.NewWriter(&pcap)
			w := pcapgo.NewWriterNanos(bw)
			require.NoError(t, w.WriteFileHeader(100, layers.LinkTypeEthernet))
			cw := &capturer{rx: rx, w: pcapWriter{w}, bw: bw, count: 50, snaplen: 100, c: captureCounts{bufFrame: rx.MaxFrame()}}
			p := newProgress(io.Discard, &fakeDevice{}, 0, cw.c.line)
			rx.Inject(30)
			go func() {
				// The rest once the core has slept (or, busy, at any time).
				for core.Stats().Sleeps == 0 && mode != lcore.Busy && t.Context().Err() == nil {
					time.Sleep(time.Millisecond)
				}
				rx.Inject(30)
			}()
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			require.NoError(t, cw.run(ctx, core, p))
			require.NoError(t, ctx.Err(), "stopped by the count, not the timeout")
			require.EqualValues(t, 50, cw.c.written)
			r, err := pcapgo.NewReader(&pcap)
			require.NoError(t, err)
			n := 0
			for {
				data, _, err := r.ReadPacketData()
				if err != nil {
					break
				}
				require.Len(t, data, lcoretest.FrameLen)
				n++
			}
			require.Equal(t, 50, n, "the pcap holds -count frames, flushed")
			require.GreaterOrEqual(t, rx.Counters().Posts, uint64(50), "buffers posted again")
			if mode != lcore.Busy {
				require.Positive(t, rx.Counters().Fired, "the queue raised its interrupt for the frames that came while the core slept")
				require.Positive(t, core.Stats().Wakeups)
				require.Positive(t, core.Interrupts(rx), "the core counts the interrupts it took for the queue")
			}
		})
	}
}

// TestProgressWhileAsleep: an idle core in interrupt mode still prints
// progress lines (runCore wakes it), and -duration ends it.
func TestProgressWhileAsleep(t *testing.T) {
	rx := newTestQueue(t)
	core := newTestCore(t, lcore.Interrupt)
	var human bytes.Buffer
	var pcap bytes.Buffer
	bw := bufio.NewWriter(&pcap)
	cw := &capturer{rx: rx, w: pcapWriter{pcapgo.NewWriterNanos(bw)}, bw: bw, snaplen: 100, c: captureCounts{bufFrame: rx.MaxFrame()}}
	p := newProgress(&human, &fakeDevice{}, 30*time.Millisecond, cw.c.line)
	ctx, cancel := context.WithTimeout(t.Context(), 400*time.Millisecond)
	defer cancel()
	require.NoError(t, cw.run(ctx, core, p), "a context that ends is success")
	lines := strings.Count(human.String(), "written 0")
	st := core.Stats()
	t.Logf("%d progress lines in 400 ms; core %+v", lines, st)
	require.GreaterOrEqual(t, lines, 4, "about one line per 30 ms while the core sleeps")
	require.GreaterOrEqual(t, st.Wakeups, uint64(lines))
	require.Zero(t, st.Completions)
}

// TestEchoOnCore: echo's handler on a core posts every buffer again and
// counts what it ignores (the test queue's frames are all zeros).
func TestEchoOnCore(t *testing.T) {
	rx, tx := newTestQueue(t), newTestQueue(t)
	core := newTestCore(t, lcore.Interrupt)
	e := newAnswerer(net.HardwareAddr{2, 0, 0, 0, 0, 1}, netip.MustParseAddr("10.0.0.1"), map[uint16]bool{7: true})
	e.rx, e.tx = rx, tx
	p := newProgress(io.Discard, &fakeDevice{}, 0, e.counters)
	rx.Inject(40)
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		for rx.Counters().Posts < 40 && t.Context().Err() == nil {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	require.NoError(t, e.run(ctx, core, p))
	require.EqualValues(t, 40, rx.Counters().Posts, "every buffer posted again")
	require.EqualValues(t, 40, e.ignored.Load())
	require.Zero(t, e.errs.Load())
}

// TestCaptureFilterOnCore: frames the filter refuses are counted and their
// buffers posted again, never written; -count counts the frames that
// pass; without -w each passing frame is one text line.
func TestCaptureFilterOnCore(t *testing.T) {
	rx := newTestQueue(t)
	core := newTestCore(t, lcore.Interrupt)
	var out bytes.Buffer
	bw := bufio.NewWriter(&out)
	// The test queue's frames are 64 zero bytes: ethertype 0, MACs zero.
	refuse, err := pcapfilter.New("not ether dst 00:00:00:00:00:00 or ip")
	require.NoError(t, err)
	cw := &capturer{rx: rx, w: &textWriter{w: bw}, bw: bw, filter: refuse, snaplen: 100, pipe: true,
		c: captureCounts{bufFrame: rx.MaxFrame(), filtered: true}}
	p := newProgress(io.Discard, &fakeDevice{}, 0, cw.c.line)
	rx.Inject(40)
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		for rx.Counters().Posts < 40 && t.Context().Err() == nil {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	require.NoError(t, cw.run(ctx, core, p))
	require.EqualValues(t, 40, cw.c.rejected)
	require.Zero(t, cw.c.written)
	require.Empty(t, out.String())
	require.Contains(t, cw.c.line(), "written 0, filtered out 40")
	require.EqualValues(t, 40, cw.c.details()["filtered_out"])

	rx = newTestQueue(t)
	core = newTestCore(t, lcore.Busy)
	take, err := pcapfilter.New("ether src 00:00:00:00:00:00 and less 64 and not vlan")
	require.NoError(t, err)
	cw = &capturer{rx: rx, w: &textWriter{w: bw}, bw: bw, filter: take, count: 25, snaplen: 100, pipe: true,
		c: captureCounts{bufFrame: rx.MaxFrame(), filtered: true}}
	p = newProgress(io.Discard, &fakeDevice{}, 0, cw.c.line)
	rx.Inject(60)
	ctx, cancel = context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, cw.run(ctx, core, p))
	require.NoError(t, ctx.Err(), "stopped by the count")
	require.EqualValues(t, 25, cw.c.written)
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	require.Len(t, lines, 25, "one line per frame, flushed")
	require.Regexp(t, `^\d\d:\d\d:\d\d\.\d{6} 00:00:00:00:00:00 > 00:00:00:00:00:00, ethertype 0x0000, length 64$`, lines[0])
}

// TestSinkQueuesOnCores: sink -queues N polls each queue with a core of
// its own, counts per queue and in all, and stops all cores at -count.
func TestSinkQueuesOnCores(t *testing.T) {
	s := &sink{count: 90}
	var cores []*lcore.Core
	var qs []*lcoretest.Queue
	for _, mode := range []lcore.Mode{lcore.Busy, lcore.Adaptive, lcore.Interrupt} {
		q := newTestQueue(t)
		qs = append(qs, q)
		s.queues = append(s.queues, &sinkQueue{rx: q})
		cores = append(cores, newTestCore(t, mode))
	}
	var human bytes.Buffer
	p := newProgress(&human, &fakeDevice{}, 0, s.line)
	p.extraCores = cores[1:]
	for _, q := range qs {
		q.Inject(30)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, s.run(ctx, cores, p))
	require.NoError(t, ctx.Err(), "stopped by the count on all queues, not the timeout")
	for i, q := range s.queues {
		require.EqualValues(t, 30, q.received.Load(), "queue %d", i)
		require.GreaterOrEqual(t, qs[i].Counters().Posts, uint64(30), "buffers posted again")
	}
	require.Equal(t, "received 90, error completions 0, per queue [30 30 30]", s.line())
	d := s.details(cores[1:])
	require.EqualValues(t, 90, d["received"])
	per := d["queues"].([]map[string]any)
	require.Len(t, per, 3)
	require.EqualValues(t, 30, per[2]["received"])
	require.Equal(t, "interrupt", per[2]["core"].(*coreSummary).Mode, "each queue's core is described")
	for _, c := range cores {
		require.Positive(t, c.Stats().Completions, "every core read its queue")
	}
}
