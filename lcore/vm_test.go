package lcore_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/lcore"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/virtio"
	"github.com/vfnic/vfnic/qemu"
	"github.com/vfnic/vfnic/vfio"
	"golang.org/x/sys/unix"
)

// The guest's NIC, and the frames of the conversation with the host: the
// guest asks for a burst ("lcore-go N"), the host sends N data frames.
const (
	vmSlot     = 4
	etherType  = 0x88b5 // IEEE local experimental
	goMagic    = "lcore-go "
	dataMagic  = "lcore-data"
	rateMagic  = "lcore-rate"  // + phase byte: a frame of a rate phase, counted by the host
	countMagic = "lcore-count" // + phase byte: the guest asks for a phase's count
	replyMagic = "lcore-counted"
)

// TestVM boots a guest with one virtio-net NIC (packed rings, bound to
// vfio-pci) on a dgram netdev served below, and runs TestGuestCore there:
// a polling core in each mode receives the frames this side sends.
func TestVM(t *testing.T) {
	if qemu.InGuest() {
		t.Skip("host side: boots the guest that runs TestGuestCore")
	}
	if testing.Short() {
		t.Skip("boots a VM")
	}
	qemu.RequireVM(t)
	nd, err := qemu.NewDgram()
	require.NoError(t, err)
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(fd)
	require.NoError(t, unix.Bind(fd, &unix.SockaddrInet4{Port: nd.HostPort, Addr: [4]byte{127, 0, 0, 1}}))
	require.NoError(t, unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 100000}))
	// The rate benchmark's frames must not be dropped here.
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64<<20) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 8<<20)
	}
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	served := make(chan error, 1)
	go func() {
		served <- serveBursts(ctx, fd, &unix.SockaddrInet4{Port: nd.QEMUPort, Addr: [4]byte{127, 0, 0, 1}})
	}()
	cfg := qemu.Config{
		NICs:    []qemu.NIC{{Model: qemu.VirtioNet, Slot: vmSlot, Net: nd, Packed: true, Bind: qemu.BindVFIO}},
		Timeout: 3 * time.Minute,
	}
	run := "^TestGuestCore$"
	var env []string
	if os.Getenv("VFNIC_LCORE_BENCH") != "" {
		// The rate benchmark: not part of make test.
		run, env = "^TestGuest(Core|TxRate)$", []string{"VFNIC_LCORE_BENCH=1"}
		cfg.Output = os.Stderr
	}
	qemu.RunGoTestT(t, cfg, qemu.GoTest{Package: "github.com/vfnic/vfnic/lcore", Run: run, Env: env})
	stop()
	require.NoError(t, <-served)
}

// serveBursts answers each "lcore-go N" frame with N broadcast data frames,
// 16 at a time with a pause between, so that QEMU's socket (about 208 KiB)
// never overflows.
func serveBursts(ctx context.Context, fd int, qemuAddr unix.Sockaddr) error {
	buf := make([]byte, 2048)
	var rateCounts [256]uint64
	frame := make([]byte, 64)
	copy(frame, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02, 0, 0, 0, 0, 1})
	binary.BigEndian.PutUint16(frame[12:], etherType)
	copy(frame[14:], dataMagic)
	for ctx.Err() == nil {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err == unix.EAGAIN || err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		p := buf[:n]
		if n < 14 || binary.BigEndian.Uint16(p[12:]) != etherType {
			continue
		}
		switch body := p[14:]; {
		case len(body) > len(rateMagic) && bytes.HasPrefix(body, []byte(rateMagic)):
			rateCounts[body[len(rateMagic)]]++
			continue
		case len(body) > len(countMagic) && bytes.HasPrefix(body, []byte(countMagic)):
			phase := body[len(countMagic)]
			reply := make([]byte, 64)
			copy(reply, frame[:14])
			copy(reply[14:], replyMagic)
			reply[14+len(replyMagic)] = phase
			binary.BigEndian.PutUint64(reply[15+len(replyMagic):], rateCounts[phase])
			if err := unix.Sendto(fd, reply, 0, qemuAddr); err != nil {
				return err
			}
			continue
		case !bytes.HasPrefix(body, []byte(goMagic)):
			continue
		}
		count, err := strconv.Atoi(strings.TrimRight(string(p[14+len(goMagic):]), "\x00"))
		if err != nil {
			return fmt.Errorf("bad request %q", p[14:])
		}
		for i := 0; i < count; i++ {
			if err := unix.Sendto(fd, frame, 0, qemuAddr); err != nil {
				return err
			}
			if i%16 == 15 {
				time.Sleep(500 * time.Microsecond)
			}
		}
	}
	return nil
}

// TestGuestTxRate runs in the guest when VFNIC_LCORE_BENCH is set: it
// sends 64-byte frames for 3 s at a time, counted by the host, from
// today's pktgen-style loop on an ordinary goroutine (SRead when the ring
// is full) and from a polling core in each mode (a Func that sends up to
// a batch per round), three times each in A B C D order, and logs the
// median frames/s of each.
func TestGuestTxRate(t *testing.T) {
	if !qemu.InGuest() || os.Getenv("VFNIC_LCORE_BENCH") == "" {
		t.Skip("the guest's rate benchmark: VFNIC_LCORE_BENCH=1 go test -run TestVM ./lcore")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dev, err := virtio.Open(ctx, fmt.Sprintf("0000:00:%02x.0", vmSlot), virtio.Config{})
	require.NoError(t, err)
	defer dev.Close()
	rx, err := dev.Rx(0)
	require.NoError(t, err)
	tx, err := dev.Tx(0)
	require.NoError(t, err)
	for {
		if err := rx.PostRecv(nil); errors.Is(err, nic.ErrFull) {
			break
		} else {
			require.NoError(t, err)
		}
	}
	require.NoError(t, rx.Flush())
	cpus, err := lcore.AllowedCPUs()
	require.NoError(t, err)
	comps := make([]nic.Completion, 256)
	drain := func() {
		for tx.Outstanding() > 0 {
			_, err := tx.SRead(context.Background(), comps, tx.Outstanding(), 5*time.Second)
			require.NoError(t, err)
		}
	}
	frameFor := func(phase byte) []byte {
		f := make([]byte, 64)
		copy(f, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
		copy(f[6:], dev.MAC())
		binary.BigEndian.PutUint16(f[12:], etherType)
		copy(f[14:], rateMagic)
		f[14+len(rateMagic)] = phase
		return f
	}
	count := func(phase byte) uint64 {
		time.Sleep(300 * time.Millisecond) // the device and the host socket catch up
		f := make([]byte, 64)
		copy(f, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
		copy(f[6:], dev.MAC())
		binary.BigEndian.PutUint16(f[12:], etherType)
		copy(f[14:], countMagic)
		f[14+len(countMagic)] = phase
		require.NoError(t, tx.Send(f, nil))
		require.NoError(t, tx.Flush())
		drain()
		end := time.Now().Add(5 * time.Second)
		for time.Now().Before(end) {
			n, err := rx.SRead(context.Background(), comps, 1, time.Second)
			if errors.Is(err, nic.ErrTimeout) {
				continue
			}
			require.NoError(t, err)
			var v uint64
			found := false
			for _, c := range comps[:n] {
				if c.Err == nil && len(c.Data) >= 15+len(replyMagic)+8 && bytes.Equal(c.Data[14:14+len(replyMagic)], []byte(replyMagic)) &&
					c.Data[14+len(replyMagic)] == phase {
					v, found = binary.BigEndian.Uint64(c.Data[15+len(replyMagic):]), true
				}
				if c.Err == nil {
					require.NoError(t, rx.Repost(c.Buf, nil))
				}
			}
			require.NoError(t, rx.Flush())
			if found {
				return v
			}
		}
		t.Fatalf("no count from the host for phase %d", phase)
		return 0
	}
	const runFor = 3 * time.Second
	loop := func(phase byte) uint64 { // today's pktgen loop
		frame := frameFor(phase)
		ctx, cancel := context.WithTimeout(context.Background(), runFor)
		defer cancel()
		var sent uint64
		for ctx.Err() == nil {
			err := tx.Send(frame, nil)
			if errors.Is(err, nic.ErrFull) {
				require.NoError(t, tx.Flush())
				tx.Poll(comps)
				if tx.Outstanding() >= tx.Size() {
					if _, err := tx.SRead(ctx, comps, 1, -1); err != nil && ctx.Err() == nil {
						require.NoError(t, err)
					}
				}
				continue
			}
			require.NoError(t, err)
			sent++
			if sent%32 == 0 {
				require.NoError(t, tx.Flush())
				tx.Poll(comps)
			}
		}
		require.NoError(t, tx.Flush())
		drain()
		return sent
	}
	onCore := func(mode lcore.Mode, phase byte) uint64 {
		frame := frameFor(phase)
		core, err := lcore.New(lcore.Config{CPU: cpus[len(cpus)-1], Mode: mode})
		require.NoError(t, err)
		defer core.Close()
		var sent uint64
		require.NoError(t, core.AddQueue(tx, nil))
		require.NoError(t, core.AddFunc(func() (int, error) {
			n := 0
			for ; n < lcore.DefaultBatch; n++ {
				if err := tx.Send(frame, nil); errors.Is(err, nic.ErrFull) {
					break
				} else if err != nil {
					return n, err
				}
			}
			sent += uint64(n)
			return n, nil
		}))
		ctx, cancel := context.WithTimeout(context.Background(), runFor)
		defer cancel()
		require.NoError(t, core.Start(ctx))
		require.NoError(t, core.Wait(context.Background()))
		require.NoError(t, tx.Flush())
		drain()
		t.Logf("  core %v: %+v", mode, core.Stats())
		return sent
	}
	type cfg struct {
		name string
		run  func(phase byte) uint64
	}
	cfgs := []cfg{
		{"pktgen loop", loop},
		{"core busy", func(p byte) uint64 { return onCore(lcore.Busy, p) }},
		{"core adaptive", func(p byte) uint64 { return onCore(lcore.Adaptive, p) }},
		{"core interrupt", func(p byte) uint64 { return onCore(lcore.Interrupt, p) }},
	}
	rates := make(map[string][]float64)
	phase := byte(1)
	const reps = 3
	for rep := 0; rep < reps; rep++ {
		for _, c := range cfgs {
			sent := c.run(phase)
			got := count(phase)
			r := float64(got) / runFor.Seconds()
			rates[c.name] = append(rates[c.name], r)
			t.Logf("%-15s run %d: sent %d, host counted %d: %.0f frames/s", c.name, rep+1, sent, got, r)
			phase++
		}
	}
	median := func(v []float64) float64 {
		v = slices.Clone(v)
		slices.Sort(v)
		return v[len(v)/2]
	}
	base := median(rates["pktgen loop"])
	for _, c := range cfgs {
		m := median(rates[c.name])
		t.Logf("TX 64-byte frames, median of %d runs: %-15s %8.0f frames/s  %.2fx the pktgen loop (runs: %.0f)", reps, c.name, m, m/base, rates[c.name])
	}
}

// TestGuestCore runs in the guest: a core in each mode, pinned to the last
// CPU, owns the NIC's receive queue; every frame the host sends reaches
// its handler; an idle adaptive core costs little CPU and still wakes. It
// logs each mode's latency of a first frame after an idle pause, and the
// adaptive core's CPU time while idle (1 s; 10 s with VFNIC_LCORE_BENCH).
func TestGuestCore(t *testing.T) {
	if !qemu.InGuest() {
		t.Skip("needs the guest's virtio-net NIC: runs inside the guest booted by TestVM")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addr := fmt.Sprintf("0000:00:%02x.0", vmSlot)
	dev, err := virtio.Open(ctx, addr, virtio.Config{})
	require.NoError(t, err)
	defer dev.Close()
	rx, err := dev.Rx(0)
	require.NoError(t, err)
	tx, err := dev.Tx(0)
	require.NoError(t, err)
	for {
		if err := rx.PostRecv(nil); errors.Is(err, nic.ErrFull) {
			break
		} else {
			require.NoError(t, err)
		}
	}
	require.NoError(t, rx.Flush())
	cpus, err := lcore.AllowedCPUs()
	require.NoError(t, err)

	ask := func(n int) {
		f := make([]byte, 64)
		copy(f, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
		copy(f[6:], dev.MAC())
		binary.BigEndian.PutUint16(f[12:], etherType)
		copy(f[14:], goMagic+strconv.Itoa(n))
		require.NoError(t, tx.Send(f, nil))
		require.NoError(t, tx.Flush())
		_, err := tx.SRead(context.Background(), make([]nic.Completion, 8), 1, 5*time.Second)
		require.NoError(t, err)
	}
	idleFor := time.Second
	if os.Getenv("VFNIC_LCORE_BENCH") != "" {
		idleFor = 10 * time.Second
	}
	firsts := map[lcore.Mode]time.Duration{}
	for _, mode := range []lcore.Mode{lcore.Busy, lcore.Adaptive, lcore.Interrupt} {
		t.Run(mode.String(), func(t *testing.T) {
			core, err := lcore.New(lcore.Config{CPU: cpus[len(cpus)-1], Mode: mode})
			require.NoError(t, err)
			defer core.Close()
			var got, other, lastAt atomic.Int64
			require.NoError(t, core.AddQueue(rx, func(q nic.Queue, batch []nic.Completion) error {
				lastAt.Store(time.Now().UnixNano())
				for _, c := range batch {
					if c.Err != nil {
						return c.Err
					}
					if len(c.Data) >= 14+len(dataMagic) && bytes.Equal(c.Data[14:14+len(dataMagic)], []byte(dataMagic)) {
						got.Add(1)
					} else {
						other.Add(1)
					}
					if err := rx.Repost(c.Buf, nil); err != nil {
						return err
					}
				}
				return nil
			}))
			require.NoError(t, core.Start(context.Background()))
			// A core that sleeps on the queue's interrupt has it
			// delivered to its own CPU.
			steered, err := core.Steered()
			require.NoError(t, err)
			if mode == lcore.Busy {
				require.Zero(t, steered)
			} else {
				require.Equal(t, 1, steered)
				irq, err := vfio.MSIXIRQ(addr, 1) // virtio's rx0 vector
				require.NoError(t, err)
				eff, err := os.ReadFile(fmt.Sprintf("/proc/irq/%d/effective_affinity_list", irq))
				require.NoError(t, err)
				require.Equal(t, strconv.Itoa(cpus[len(cpus)-1]), strings.TrimSpace(string(eff)), "IRQ %d's CPU", irq)
			}
			burst := func(n int) time.Duration {
				want := got.Load() + int64(n)
				t0 := time.Now()
				ask(n)
				end := time.Now().Add(30 * time.Second)
				for got.Load() < want && time.Now().Before(end) {
					time.Sleep(time.Millisecond)
				}
				require.Equal(t, want, got.Load(), "frames received (other frames: %d)", other.Load())
				return time.Since(t0)
			}
			d := burst(2000)
			t.Logf("%v: 2000 frames in %v", mode, d.Round(time.Millisecond))
			if mode == lcore.Adaptive {
				tid := core.ThreadID()
				c0 := guestThreadCPU(t, tid)
				time.Sleep(idleFor)
				used := guestThreadCPU(t, tid) - c0
				t.Logf("adaptive core idle for %v: %v of CPU (%.2f%% of one CPU); %+v",
					idleFor, used, 100*used.Seconds()/idleFor.Seconds(), core.Stats())
				require.Less(t, used, idleFor/5)
				burst(100) // it still wakes
			}
			// First frame after an idle pause (long past the adaptive
			// core's idle interval, so it sleeps): from the request to
			// the handler, which includes the host's turn-around.
			const asks = 21
			lat := make([]time.Duration, 0, asks)
			for range asks {
				time.Sleep(20 * time.Millisecond)
				want := got.Load() + 1
				t0 := time.Now()
				ask(1)
				end := time.Now().Add(10 * time.Second)
				for got.Load() < want && time.Now().Before(end) {
					time.Sleep(100 * time.Microsecond)
				}
				require.Equal(t, want, got.Load(), "first frame not received")
				lat = append(lat, time.Duration(lastAt.Load()-t0.UnixNano()))
			}
			slices.Sort(lat)
			firsts[mode] = lat[asks/2]
			t.Logf("%v: first frame after 20 ms idle, request to handler: median %v, min %v, max %v (%d requests)",
				mode, lat[asks/2].Round(time.Microsecond), lat[0].Round(time.Microsecond), lat[asks-1].Round(time.Microsecond), asks)
			require.NoError(t, core.Close())
			st := core.Stats()
			t.Logf("%v: %+v, rx %+v", mode, st, rx.Stats())
			if mode != lcore.Busy {
				require.Greater(t, st.Sleeps, uint64(0))
				require.Greater(t, st.Wakeups, uint64(0))
			}
		})
	}
	if a, i := firsts[lcore.Adaptive], firsts[lcore.Interrupt]; a > 0 && i > 0 {
		t.Logf("first frame after idle: adaptive %v = %.2fx the interrupt mode's %v (busy: %v)",
			a.Round(time.Microsecond), a.Seconds()/i.Seconds(), i.Round(time.Microsecond), firsts[lcore.Busy].Round(time.Microsecond))
	}
}

// guestThreadCPU reads a thread's user+system time from /proc.
func guestThreadCPU(t *testing.T, tid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/stat", tid))
	require.NoError(t, err)
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	require.Greater(t, len(f), 12)
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	require.NoError(t, errors.Join(err1, err2))
	return time.Duration(ut+st) * time.Second / 100
}
