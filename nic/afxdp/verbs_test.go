package afxdp

import (
	"testing"

	"github.com/stretchr/testify/require"
	vt "github.com/vfnic/vfnic/internal/vethtest"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/verbs/nicverbs/nicverbstest"
)

// TestVerbs runs the verbs CQ's behaviour tests (verbs/nicverbs/
// nicverbstest) over an afxdp queue pair: creation limits, the iterator
// over real transmit completions, request-notify with a completion
// channel woken through the socket's readiness forwarder, the lost-wake-up
// loop, solicited-only arms, the flush at close. The frame goes to the
// veth peer, where nobody reads it.
func TestVerbs(t *testing.T) {
	v := vt.New(t, 1)
	fds0 := socketFDs(t)
	dev := openIn(t, v.A, "vfx0", nic.Config{})
	frame := make([]byte, 60)
	for i := range 6 {
		frame[i] = 0xff
	}
	copy(frame[6:], dev.MAC())
	frame[12], frame[13] = vt.TestType>>8, vt.TestType&0xff
	nicverbstest.Run(t, dev, frame, nicverbstest.Rounds(t))
	require.Equal(t, fds0, socketFDs(t), "every socket returned")
}
