package cq

import (
	"errors"
	"math"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestAttrResolve(t *testing.T) {
	lim := Limits{DefaultSize: 512, MaxSize: 65536, PowerOfTwo: true, DefaultFormat: FormatData, Vectors: 2}
	a, err := lim.Resolve(Attr{})
	require.NoError(t, err)
	require.Equal(t, 512, a.Size)
	require.Equal(t, FormatData, a.Format)
	a, err = lim.Resolve(Attr{Size: 1000})
	require.NoError(t, err)
	require.Equal(t, 1024, a.Size)
	for _, bad := range []Attr{{Size: -1}, {Size: 65537}, {Format: 9}, {WaitObj: 17}, {WaitCond: 3},
		{Flags: 1}, {Flags: AttrAffinity, SignalingVector: 2}, {Flags: AttrAffinity, SignalingVector: -1}} {
		_, err := lim.Resolve(bad)
		require.ErrorIs(t, err, ErrInvalid, "%+v", bad)
	}
	_, err = lim.Resolve(Attr{WaitObj: WaitSet})
	require.ErrorIs(t, err, ErrNotSupported)
	a, err = lim.Resolve(Attr{Flags: AttrAffinity, SignalingVector: 1})
	require.NoError(t, err)
	require.Equal(t, 1, a.SignalingVector)
}

func TestErrno(t *testing.T) {
	require.ErrorIs(t, ETRUNC, ETRUNC)
	require.ErrorIs(t, EAGAIN, ErrAgain)
	require.Equal(t, "truncation error", ETRUNC.Error())
	require.Equal(t, EOVERRUN, ErrnoOf(ErrOverrun))
	require.Equal(t, EAGAIN, ErrnoOf(ErrTimeout))
	require.Equal(t, ENOSYS, ErrnoOf(ErrNoWait))
	require.ErrorIs(t, ErrTimeout, ErrAgain)
	require.ErrorIs(t, ErrSignaled, ErrAgain)
	require.NotErrorIs(t, ErrTimeout, ErrSignaled)
	require.Equal(t, "RECV|SEND", (FlagSend | FlagRecv).String())
}

// TestResolveEverySize resolves every size from 1 to 65536: the actual size
// is at least the request, a power of two when the device needs one, and
// the smallest such; one past the maximum is refused.
func TestResolveEverySize(t *testing.T) {
	for _, pow2 := range []bool{false, true} {
		lim := Limits{MaxSize: 65536, PowerOfTwo: pow2}
		for n := 1; n <= 65536; n++ {
			a, err := lim.Resolve(Attr{Size: n})
			if err != nil {
				t.Fatalf("size %d: %v", n, err)
			}
			want := n
			if pow2 {
				want = 1
				for want < n {
					want <<= 1
				}
			}
			if a.Size != want {
				t.Fatalf("size %d (power of two %v): got %d, want %d", n, pow2, a.Size, want)
			}
		}
		if _, err := lim.Resolve(Attr{Size: 65537}); !errors.Is(err, ErrInvalid) {
			t.Fatalf("size 65537: %v", err)
		}
	}
}

// TestResolveHugeSize: sizes whose rounding up to a power of two would
// overflow int (above 2^62) fail with ErrInvalid, with or without a
// provider maximum, and so do a huge default size and sizes above the
// package's own limit.
func TestResolveHugeSize(t *testing.T) {
	huge := []int{math.MaxInt/2 + 2, math.MaxInt, math.MaxInt/2 + 1, sizeLimit + 1}
	for _, lim := range []Limits{{PowerOfTwo: true}, {PowerOfTwo: true, MaxSize: 65536},
		{}, {MaxSize: math.MaxInt, PowerOfTwo: true}} {
		for _, n := range huge {
			a, err := lim.Resolve(Attr{Size: n})
			require.ErrorIs(t, err, ErrInvalid, "size %d, %+v: got %d", n, lim, a.Size)
			require.ErrorIs(t, err, os.ErrInvalid)
		}
		lim.DefaultSize = math.MaxInt/2 + 2
		_, err := lim.Resolve(Attr{})
		require.ErrorIs(t, err, ErrInvalid, "a huge default size, %+v", lim)
	}
	a, err := Limits{PowerOfTwo: true}.Resolve(Attr{Size: sizeLimit - 1})
	require.NoError(t, err)
	require.Equal(t, sizeLimit, a.Size, "rounds up to the limit itself")
}
