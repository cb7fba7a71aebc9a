package afpacket

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/internal/vethtest"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/internal/sendcheck"
	"golang.org/x/sys/unix"
)

// TestSendFunc runs the in-place send's check on one end of a veth pair,
// a Linux socket reading the other.
func TestSendFunc(t *testing.T) {
	v := vethtest.New(t, 1)
	dev := openIn(t, v.A, "vfx0", nic.Config{})
	p := v.Peer(t)
	tx, err := dev.Tx(0)
	require.NoError(t, err)
	sendcheck.Run(t, tx, p.MAC, dev.MAC(), func(t testing.TB, n int) [][]byte {
		return p.Frames(t, n, sendcheck.EtherType, func() { _ = tx.Flush() })
	})
}

// TestRefusedFrame: a frame the kernel refuses (an untagged frame longer
// than the MTU allows; MaxFrame leaves room for a VLAN tag) completes with
// the kernel's error, and the frames behind it still go out: the queue
// does not stall on it.
func TestRefusedFrame(t *testing.T) {
	v := vethtest.New(t, 1)
	dev := openIn(t, v.A, "vfx0", nic.Config{})
	p := v.Peer(t)
	tx, err := dev.Tx(0)
	require.NoError(t, err)
	frame := func(seq, n int) []byte {
		b := make([]byte, n)
		copy(b, p.MAC)
		copy(b[6:], dev.MAC())
		binary.BigEndian.PutUint16(b[12:], sendcheck.EtherType)
		b[14] = byte(seq)
		return b
	}
	require.Greater(t, tx.MaxFrame(), 1514)
	require.NoError(t, tx.Send(frame(1, 100), 1))
	require.NoError(t, tx.Send(frame(2, tx.MaxFrame()), 2))
	require.NoError(t, tx.Send(frame(3, 1514), 3))
	require.NoError(t, tx.Flush())
	comps := make([]nic.Completion, 8)
	var got []nic.Completion
	for deadline := time.Now().Add(5 * time.Second); len(got) < 3 && time.Now().Before(deadline); {
		n := tx.Poll(comps)
		got = append(got, comps[:n]...)
	}
	require.Len(t, got, 3)
	require.NoError(t, got[0].Err)
	require.Equal(t, 2, got[1].Context)
	require.ErrorIs(t, got[1].Err, nic.ErrDeviceStatus)
	require.ErrorIs(t, got[1].Err, unix.EMSGSIZE)
	t.Logf("refused: %v", got[1].Err)
	require.NoError(t, got[2].Err)
	frames := p.Frames(t, 2, sendcheck.EtherType, nil)
	require.Equal(t, []byte{1, 3}, []byte{frames[0][14], frames[1][14]})
	require.Equal(t, 1514, len(frames[1]))
	require.EqualValues(t, 1, tx.Stats().Errors)
}
