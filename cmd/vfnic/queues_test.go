package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/lcore"
	"github.com/vfnic/vfnic/lcore/lcoretest"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/igb"
)

// indexRecorder is a frame source that records which of the run's frames
// it was asked for (read once its core stopped).
type indexRecorder struct {
	frame [64]byte
	got   []uint64
}

func (r *indexRecorder) next(i uint64) []byte {
	r.got = append(r.got, i)
	binary.BigEndian.PutUint64(r.frame[42:], i)
	return r.frame[:]
}

// testCores returns n unpinned cores, in the modes in turn.
func testCores(t *testing.T, n int) []*lcore.Core {
	modes := []lcore.Mode{lcore.Busy, lcore.Adaptive, lcore.Interrupt}
	var cs []*lcore.Core
	for i := range n {
		cs = append(cs, newTestCore(t, modes[i%len(modes)]))
	}
	return cs
}

// TestPktgenQueues: pktgen -queues 3 -count 100 sends each of the run's
// frames 0 to 99 once, queue i the frames i, i+3, ..., each queue on its
// own core, and stops when every queue sent its share.
func TestPktgenQueues(t *testing.T) {
	const total, nq = 100, 3
	cores := testCores(t, nq)
	var gens pktgens
	var txs []*lcoretest.Queue
	for i := range nq {
		tx := newTestQueue(t)
		txs = append(txs, tx)
		n := uint64(total / nq)
		if i < total%nq {
			n++
		}
		gens = append(gens, &pktgen{tx: tx, src: &indexRecorder{}, count: n, limited: true, first: uint64(i), stride: nq})
	}
	var human bytes.Buffer
	p := newProgress(&human, &fakeDevice{}, 0, gens.line)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, gens.run(ctx, cores, p))
	require.NoError(t, ctx.Err(), "stopped when every queue sent its share")
	var all []uint64
	for i, g := range gens {
		got := g.src.(*indexRecorder).got
		require.EqualValues(t, len(got), g.sent.Load(), "queue %d", i)
		require.EqualValues(t, len(got), txs[i].Counters().Posts, "queue %d sent on its own queue", i)
		for _, x := range got {
			require.EqualValues(t, i, x%nq, "queue %d sends its frames only", i)
		}
		all = append(all, got...)
	}
	slices.Sort(all)
	want := make([]uint64, total)
	for i := range want {
		want[i] = uint64(i)
	}
	require.Equal(t, want, all, "each frame of the run once")
	require.Equal(t, "queued 100, send errors 0, ring-full waits 0", gens.line())
	for i, c := range cores {
		require.Positive(t, c.Stats().Polls, "core %d ran", i)
	}
}

// TestCaptureQueues: capture -queues 3 writes the frames of every queue
// to the one output, whole lines, and stops all cores at -count.
func TestCaptureQueues(t *testing.T) {
	const nq = 3
	cores := testCores(t, nq)
	var out bytes.Buffer
	bw := bufio.NewWriter(&out)
	var rxs []nic.RxQueue
	for range nq {
		q := newTestQueue(t)
		q.Inject(30)
		rxs = append(rxs, q)
	}
	cw := &capturer{rxs: rxs, w: &textWriter{w: bw}, bw: bw, count: 75, snaplen: 100, pipe: true,
		c: captureCounts{bufFrame: rxs[0].MaxFrame()}}
	p := newProgress(io.Discard, &fakeDevice{}, 0, cw.line)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, cw.runOn(ctx, cores, p))
	require.NoError(t, ctx.Err(), "stopped by the count")
	require.EqualValues(t, 75, cw.c.written)
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	require.Len(t, lines, 75, "one whole line per frame from all queues")
	for _, l := range lines {
		require.Regexp(t, `^\d\d:\d\d:\d\d\.\d{6} 00:00:00:00:00:00 > 00:00:00:00:00:00, ethertype 0x0000, length 64$`, l)
	}
	for i, c := range cores {
		require.Positive(t, c.Stats().Completions, "core %d read its queue", i)
	}
}

// TestEchoQueues: echo -queues 2 reads each queue on its own core, with
// one set of counters.
func TestEchoQueues(t *testing.T) {
	cores := testCores(t, 2)
	var es []*echoer
	var rxs []*lcoretest.Queue
	for i := range 2 {
		e := newAnswerer(net.HardwareAddr{2, 0, 0, 0, 0, 1}, netip.MustParseAddr("10.0.0.1"), map[uint16]bool{7: true})
		if i > 0 {
			e.echoTally = es[0].echoTally
		}
		rx := newTestQueue(t)
		e.rx, e.tx = rx, newTestQueue(t)
		rx.Inject(20 * (i + 1))
		rxs = append(rxs, rx)
		es = append(es, e)
	}
	p := newProgress(io.Discard, &fakeDevice{}, 0, es[0].counters)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	go func() {
		for (rxs[0].Counters().Posts < 20 || rxs[1].Counters().Posts < 40) && ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	require.NoError(t, runEchoers(ctx, es, cores, p))
	require.EqualValues(t, 60, es[0].ignored.Load(), "the zero frames of both queues, counted once")
	require.Contains(t, es[1].counters(), "ignored 60")
}

// TestForwardQueues: fwd -queues 2 forwards queue i of one port out of
// queue i of the other, on core i, and sums per side.
func TestForwardQueues(t *testing.T) {
	cores := testCores(t, 2)
	f := &forwarder{}
	var txs [2][2]*lcoretest.Queue
	for q := range 2 {
		var pair [2]*fwdPort
		for i, addr := range []string{"a", "b"} {
			rx, tx := newTestQueue(t), newTestQueue(t)
			rx.Inject(10 * (q + 1) * (i + 1))
			txs[q][i] = tx
			pair[i] = &fwdPort{addr: addr, rx: rx, tx: tx}
		}
		f.queues = append(f.queues, pair)
	}
	p := newProgress(io.Discard, &fakeDevice{}, 0, f.line)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	go func() {
		// a's queue q received 10(q+1) frames, b's 20(q+1).
		for ctx.Err() == nil && (txs[0][1].Counters().Posts < 10 || txs[1][1].Counters().Posts < 20 ||
			txs[0][0].Counters().Posts < 20 || txs[1][0].Counters().Posts < 40) {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	require.NoError(t, f.runOn(ctx, cores, p))
	require.EqualValues(t, 10, txs[0][1].Counters().Posts, "a's queue 0 out of b's queue 0")
	require.EqualValues(t, 20, txs[1][1].Counters().Posts, "a's queue 1 out of b's queue 1")
	require.Equal(t, "a->b 30 (dropped 0), b->a 60 (dropped 0)", f.line())
	d := f.details("io", nic.Stats{})
	per := d["ports"].([]map[string]any)[1]["queues"].([]map[string]any)
	require.EqualValues(t, 20, per[1]["sent"])
}

// TestQueueSummary: with several queues, the summary has a line and a
// JSON record per queue, and the live line per-queue rates.
func TestQueueSummary(t *testing.T) {
	dev := &fakeDevice{stats: nic.Stats{
		RxQueues: []nic.QueueStats{{Packets: 5}, {Packets: 7}},
		TxQueues: []nic.QueueStats{{Packets: 1}, {Packets: 0}},
	}}
	var human, js bytes.Buffer
	p := newProgress(&human, dev, time.Nanosecond, func() string { return "x" })
	time.Sleep(time.Millisecond)
	p.tick()
	require.Regexp(t, `per queue rx pps \[\d+ \d+\]  tx pps \[\d+ 0\]`, human.String())
	require.NoError(t, p.summary("sink", &js, nil))
	require.Contains(t, human.String(), "sink: queue 1: rx 7 frames")
	var s trafficSummary
	require.NoError(t, json.Unmarshal(js.Bytes(), &s))
	require.Len(t, s.Queues, 2)
	require.EqualValues(t, 7, s.Queues[1].Rx.Frames)
}

// hwDevice is a fake device with statistics registers.
type hwDevice struct {
	fakeDevice
	hw igb.HWStats
}

func (d *hwDevice) HWStats() (igb.HWStats, error) { return d.hw, nil }

// TestHardwareSummary: a device with statistics registers has them in
// the summary, the drop counters always and the others when not zero;
// one without says so.
func TestHardwareSummary(t *testing.T) {
	dev := &hwDevice{hw: igb.HWStats{RxGood: 5, RxGoodBytes: 340, Missed: 2, NoBuffer: 3, RxBroadcast: 1}}
	var human, js bytes.Buffer
	p := newProgress(&human, dev, 0, func() string { return "x" })
	require.NoError(t, p.summary("sink", &js, nil))
	require.Contains(t, human.String(), "sink: hardware counters: rx good 5 (340 bytes), missed 2, no buffer 3, crc errors 0, "+
		"undersize 0, oversize 0; tx good 0 (0 bytes); rx broadcast 1\n")
	var s trafficSummary
	require.NoError(t, json.Unmarshal(js.Bytes(), &s))
	require.Equal(t, &dev.hw, s.Hardware)
	require.Contains(t, js.String(), `"rx_missed":2,"rx_no_buffer":3`)

	human.Reset()
	js.Reset()
	p = newProgress(&human, &fakeDevice{}, 0, func() string { return "x" })
	require.NoError(t, p.summary("sink", &js, nil))
	require.Contains(t, human.String(), "sink: hardware counters: fake has no statistics registers: only the driver's counters\n")
	var none trafficSummary
	require.NoError(t, json.Unmarshal(js.Bytes(), &none))
	require.Nil(t, none.Hardware)
	require.Contains(t, none.HardwareNote, "no statistics registers")
}
