package afxdp

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	vt "github.com/vfnic/vfnic/internal/vethtest"
	"github.com/vfnic/vfnic/nic"
	"golang.org/x/sys/unix"
)

// withoutCaps runs f on the calling thread (locked by in) with caps
// dropped from its effective set, and raises them again after: Linux's
// capabilities are per thread, and this one goes back to the runtime.
func withoutCaps(caps []int, f func() error) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data, saved [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return err
	}
	saved = data
	for _, c := range caps {
		data[c/32].Effective &^= 1 << (c % 32)
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return err
	}
	defer func() { _ = unix.Capset(&hdr, &saved[0]) }() // raising from the permitted set cannot fail
	return f()
}

// TestPermission: without CAP_NET_RAW the AF_XDP socket, and without
// CAP_NET_ADMIN (and CAP_BPF, CAP_SYS_ADMIN) the XSKMAP, are refused
// with ErrPermission, which says what is needed.
func TestPermission(t *testing.T) {
	v := vt.New(t, 1)
	for name, caps := range map[string][]int{
		"no CAP_NET_RAW":   {unix.CAP_NET_RAW},
		"no CAP_NET_ADMIN": {unix.CAP_NET_ADMIN, unix.CAP_BPF, unix.CAP_SYS_ADMIN},
	} {
		err := vt.In(v.A, func() error {
			return withoutCaps(caps, func() error {
				d, err := Open(context.Background(), "vfx0", nic.Config{})
				if err == nil {
					_ = d.Close()
				}
				return err
			})
		})
		require.ErrorIs(t, err, ErrPermission, name)
		require.ErrorIs(t, err, unix.EPERM, name)
		require.ErrorContains(t, err, "CAP_NET_RAW", name)
	}
	// And with them back, the queue opens (nothing was left behind).
	require.NoError(t, openIn(t, v.A, "vfx0", nic.Config{}).Close())
}
