package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/gopacket/gopacket/layers"
	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/nic"

	"github.com/vfnic/vfnic/nic/softnic" // registers the softnic scheme
)

// syncBuffer is a bytes.Buffer two goroutines may use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestSoftNICEchoPktgen: vfnic echo and vfnic pktgen, unchanged, carry
// traffic between the two ends of a software NIC pair in this process (no
// device of the host is opened): pktgen sends UDP datagrams to echo's
// port 7 on end 1, echo answers each one it receives back over the wire,
// and both -json summaries agree with the wire's counters.
func TestSoftNICEchoPktgen(t *testing.T) {
	w, err := softnic.NewWire("cli-test", softnic.Options{})
	require.NoError(t, err)
	defer w.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	var echoOut, echoErr syncBuffer
	echoDone := make(chan error, 1)
	echoCtx, stopEcho := context.WithCancel(ctx)
	defer stopEcho()
	go func() {
		echoDone <- runEcho(echoCtx, []string{"-ip", "10.0.0.1", "-json", "-progress", "0", "softnic:cli-test/1"},
			stdio{out: &echoOut, err: &echoErr})
	}()
	ready := regexp.MustCompile(`for 10\.0\.0\.1 at ([0-9a-f:]{17}), .*\(ready\)`)
	var mac string
	for mac == "" {
		select {
		case err := <-echoDone:
			t.Fatalf("echo ended: %v\n%s", err, echoErr.String())
		case <-ctx.Done():
			t.Fatalf("echo not ready: %s", echoErr.String())
		case <-time.After(10 * time.Millisecond):
		}
		if m := ready.FindStringSubmatch(echoErr.String()); m != nil {
			mac = m[1]
		}
	}

	const frames = 2000
	var genOut, genErr syncBuffer
	err = runPktgen(ctx, []string{"-count", "2000", "-rate", "20000", "-dst-mac", mac, "-src-ip", "10.0.0.2",
		"-dst-ip", "10.0.0.1", "-port", "7", "-src-port", "40000", "-json", "-progress", "0", "softnic:cli-test/0"},
		stdio{out: &genOut, err: &genErr})
	require.NoError(t, err, genErr.String())
	// Echo answers what it has received; then it stops (Ctrl-C's path).
	require.Eventually(t, func() bool {
		return w.Stats(0).Sent == frames && w.Stats(1).Sent == w.Stats(0).Delivered
	}, 10*time.Second, 10*time.Millisecond, "echo answers every frame it received: %+v %+v", w.Stats(0), w.Stats(1))
	stopEcho()
	require.NoError(t, <-echoDone, echoErr.String())

	var gen, echo trafficSummary
	require.NoError(t, json.Unmarshal(genOut.b.Bytes(), &gen), genOut.String())
	require.NoError(t, json.Unmarshal(echoOut.b.Bytes(), &echo), echoOut.String())
	t.Logf("pktgen: %+v; echo: %+v %v; wire 0->1 %+v, 1->0 %+v", gen.Tx, echo.Rx, echo.Details, w.Stats(0), w.Stats(1))
	require.Equal(t, "softnic", gen.Device.Driver)
	require.Equal(t, "softnic:cli-test/0", gen.Device.Address)
	require.Equal(t, uint64(frames), gen.Tx.Frames)
	delivered := w.Stats(0).Delivered
	require.NotZero(t, delivered)
	require.Equal(t, uint64(frames), delivered+w.Stats(0).NoBuffer, "each frame reached echo's ring or found it full")
	require.Equal(t, delivered, echo.Rx.Frames)
	require.EqualValues(t, delivered, echo.Details["answered_udp"])
	require.Equal(t, delivered, echo.Tx.Frames)
}

// TestSoftNICReplay: pktgen -replay posts a pcap's frames a round's batch
// at a time (SendBurst) on a queue of 16 descriptors, so that bursts meet
// a full ring; the other end of a software NIC pair receives them all, in
// the file's order, loop after loop.
func TestSoftNICReplay(t *testing.T) {
	w, err := softnic.NewWire("cli-replay", softnic.Options{})
	require.NoError(t, err)
	defer w.Close()
	end, err := w.Open(1, nic.Config{QueueSize: 256})
	require.NoError(t, err)
	defer end.Close()
	rx, err := end.Rx(0)
	require.NoError(t, err)
	for rx.PostRecv(nil) == nil {
	}
	require.NoError(t, rx.Flush())

	const loops = 50
	var frames [][]byte
	for i := range 5 {
		f := make([]byte, 60+100*i)
		copy(f, []byte{2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x88, 0xb5, byte(i)})
		frames = append(frames, f)
	}
	pcap := filepath.Join(t.TempDir(), "replay.pcap")
	writeTestPcap(t, pcap, layers.LinkTypeEthernet, frames...)

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	got := make(chan [][]byte, 1)
	go func() {
		var seen [][]byte
		comps := make([]nic.Completion, 64)
		for len(seen) < loops*len(frames) && ctx.Err() == nil {
			n, _ := rx.SRead(ctx, comps, 1, 100*time.Millisecond)
			for _, c := range comps[:n] {
				if c.Err == nil {
					seen = append(seen, append([]byte(nil), c.Data...))
					_ = rx.Repost(c.Buf, nil)
				}
			}
			_ = rx.Flush()
		}
		got <- seen
	}()
	var genOut, genErr syncBuffer
	err = runPktgen(ctx, []string{"-replay", pcap, "-loop", fmt.Sprint(loops), "-rate", "20000", "-queue-size", "16",
		"-json", "-progress", "0", "softnic:cli-replay/0"}, stdio{out: &genOut, err: &genErr})
	require.NoError(t, err, genErr.String())
	seen := <-got
	require.Len(t, seen, loops*len(frames), "every frame of every loop arrived (wire %+v)", w.Stats(0))
	for i, f := range seen {
		require.Equal(t, frames[i%len(frames)], f, "frame %d", i)
	}
	var gen trafficSummary
	require.NoError(t, json.Unmarshal(genOut.b.Bytes(), &gen), genOut.String())
	require.Equal(t, uint64(loops*len(frames)), gen.Tx.Frames)
	t.Logf("pktgen: %+v %v", gen.Tx, gen.Details)
}
