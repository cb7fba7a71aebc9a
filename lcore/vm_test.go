package lcore_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
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
	"golang.org/x/sys/unix"
)

// The guest's NIC, and the frames of the conversation with the host: the
// guest asks for a burst ("lcore-go N"), the host sends N data frames.
const (
	vmSlot    = 4
	etherType = 0x88b5 // IEEE local experimental
	goMagic   = "lcore-go "
	dataMagic = "lcore-data"
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
	qemu.RunGoTestT(t, cfg, qemu.GoTest{Package: "github.com/vfnic/vfnic/lcore", Run: "^TestGuestCore$"})
	stop()
	require.NoError(t, <-served)
}

// serveBursts answers each "lcore-go N" frame with N broadcast data frames,
// 16 at a time with a pause between, so that QEMU's socket (about 208 KiB)
// never overflows.
func serveBursts(ctx context.Context, fd int, qemuAddr unix.Sockaddr) error {
	buf := make([]byte, 2048)
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
		if n < 14 || binary.BigEndian.Uint16(p[12:]) != etherType || !bytes.HasPrefix(p[14:], []byte(goMagic)) {
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

// TestGuestCore runs in the guest: a core in each mode, pinned to the last
// CPU, owns the NIC's receive queue; every frame the host sends reaches
// its handler; an idle adaptive core costs little CPU and still wakes.
func TestGuestCore(t *testing.T) {
	if !qemu.InGuest() {
		t.Skip("needs the guest's virtio-net NIC: runs inside the guest booted by TestVM")
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
	for _, mode := range []lcore.Mode{lcore.Busy, lcore.Adaptive, lcore.Interrupt} {
		t.Run(mode.String(), func(t *testing.T) {
			core, err := lcore.New(lcore.Config{CPU: cpus[len(cpus)-1], Mode: mode})
			require.NoError(t, err)
			defer core.Close()
			var got, other atomic.Int64
			require.NoError(t, core.AddQueue(rx, func(q nic.Queue, batch []nic.Completion) error {
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
				time.Sleep(time.Second)
				used := guestThreadCPU(t, tid) - c0
				t.Logf("adaptive core idle for 1 s: %v of CPU; %+v", used, core.Stats())
				require.Less(t, used, 200*time.Millisecond)
				burst(100) // it still wakes
			}
			require.NoError(t, core.Close())
			st := core.Stats()
			t.Logf("%v: %+v, rx %+v", mode, st, rx.Stats())
			if mode != lcore.Busy {
				require.Greater(t, st.Sleeps, uint64(0))
				require.Greater(t, st.Wakeups, uint64(0))
			}
		})
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
