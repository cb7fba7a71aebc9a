package hugepage

import (
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestFallback4K(t *testing.T) {
	m, err := Alloc(10000, Options{PageSize: Size4K})
	require.NoError(t, err)
	require.Equal(t, 12288, m.Len())
	require.Equal(t, Size4K, m.PageSize())
	require.Zero(t, m.Addr()%4096)
	b := m.Bytes()
	b[0], b[len(b)-1] = 1, 2
	require.NoError(t, m.Close())
	require.NoError(t, m.Close(), "Close is idempotent")
	require.Nil(t, m.Bytes())
	require.Zero(t, m.Addr())
}

func TestBadSizes(t *testing.T) {
	_, err := Alloc(0, Options{})
	require.ErrorIs(t, err, ErrBadSize)
	_, err = Alloc(4096, Options{PageSize: 12345})
	require.ErrorIs(t, err, ErrBadSize)
}

func TestHugepages2M(t *testing.T) {
	free, err := Free(Size2M)
	if err != nil || free < 2 {
		// The host has none reserved; the VM tests reserve and cover them.
		m, err := Alloc(4<<20, Options{})
		require.ErrorIs(t, err, ErrNoHugepages)
		require.Nil(t, m)
		var errno unix.Errno
		require.ErrorAs(t, err, &errno, "mmap's error is kept for callers to match")
		m, err = Alloc(4<<20, Options{AllowFallback: true})
		require.NoError(t, err)
		require.Equal(t, Size4K, m.PageSize())
		require.NoError(t, m.Close())
		return
	}
	m, err := Alloc(3<<20, Options{})
	require.NoError(t, err)
	require.Equal(t, Size2M, m.PageSize())
	require.Equal(t, 4<<20, m.Len())
	require.Zero(t, m.Addr()%uintptr(Size2M))
	require.NoError(t, m.Close())
}

// TestHugeLength: a length that cannot be rounded up to whole pages is
// ErrBadSize, not an overflow into a negative or small mapping.
func TestHugeLength(t *testing.T) {
	for _, o := range []Options{{}, {PageSize: Size1G}, {PageSize: Size4K}, {AllowFallback: true}} {
		m, err := Alloc(math.MaxInt-10, o)
		require.ErrorIs(t, err, ErrBadSize, "%+v", o)
		require.Nil(t, m)
	}
	for _, page := range []Size{Size4K, Size2M, Size1G} {
		n, ok := roundUp(math.MaxInt-int(page)+1, int(page))
		require.True(t, ok, "the largest length that rounds up to %s pages", page)
		require.Equal(t, math.MaxInt-int(page)+1, n)
		_, ok = roundUp(math.MaxInt-int(page)+2, int(page))
		require.False(t, ok, "one more byte does not fit in %s pages", page)
		n, ok = roundUp(1, int(page))
		require.True(t, ok)
		require.Equal(t, int(page), n)
	}
}

// TestPinErrors: when mlock fails, the error is ErrPin and keeps the
// kernel's errno, so that callers can tell a missing privilege (EPERM,
// os.ErrPermission: the limit is 0) from a limit too low (ENOMEM).
func TestPinErrors(t *testing.T) {
	var old unix.Rlimit
	require.NoError(t, unix.Getrlimit(unix.RLIMIT_MEMLOCK, &old))
	t.Cleanup(func() { require.NoError(t, unix.Setrlimit(unix.RLIMIT_MEMLOCK, &old)) })
	for _, tc := range []struct {
		limit uint64
		want  error
	}{{0, os.ErrPermission}, {4096, unix.ENOMEM}} {
		if tc.limit > old.Max {
			continue
		}
		require.NoError(t, unix.Setrlimit(unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: tc.limit, Max: old.Max}))
		err := withoutIPCLock(func() error {
			m, err := Alloc(1<<20, Options{PageSize: Size4K})
			if err == nil {
				m.Close()
			}
			return err
		})
		if errors.Is(err, errNoCapset) {
			t.Skip(err)
		}
		require.ErrorIs(t, err, ErrPin, "RLIMIT_MEMLOCK %d", tc.limit)
		require.ErrorIs(t, err, tc.want, "RLIMIT_MEMLOCK %d", tc.limit)
	}
}

var errNoCapset = errors.New("cannot drop CAP_IPC_LOCK")

// withoutIPCLock runs f on a thread without CAP_IPC_LOCK in its effective
// set (capabilities are per thread), so that mlock obeys RLIMIT_MEMLOCK
// even when the test runs as root.
func withoutIPCLock(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread exits with this goroutine, and its
		// reduced capabilities with it.
		runtime.LockOSThread()
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			errc <- fmt.Errorf("%w: capget: %w", errNoCapset, err)
			return
		}
		data[unix.CAP_IPC_LOCK/32].Effective &^= 1 << (unix.CAP_IPC_LOCK % 32)
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			errc <- fmt.Errorf("%w: capset: %w", errNoCapset, err)
			return
		}
		errc <- f()
	}()
	return <-errc
}
