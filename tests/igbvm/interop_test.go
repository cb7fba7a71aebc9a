package igbvm

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// lockedBuffer is an io.Writer safe for a command's output and the test.
type lockedBuffer struct {
	ch  chan struct{}
	buf bytes.Buffer
}

func newLockedBuffer() *lockedBuffer {
	b := &lockedBuffer{ch: make(chan struct{}, 1)}
	b.ch <- struct{}{}
	return b
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	<-b.ch
	defer func() { b.ch <- struct{}{} }()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	<-b.ch
	defer func() { b.ch <- struct{}{} }()
	return b.buf.String()
}

// TestGuestInterop: two igb NICs on one QEMU hub, one driven by `vfnic
// echo`, the other by the guest's Linux igb driver: busybox ping -c 20
// gets 20 replies, and 20 UDP datagrams through the Linux stack come
// back intact (`vfnic udpping`).
func TestGuestInterop(t *testing.T) {
	guestOnly(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	echoOut := newLockedBuffer()
	echo := exec.CommandContext(ctx, vfnicBin, "echo", "-ip", echoIP, fmt.Sprintf("0000:00:%02x.0", slotEcho))
	echo.Stdout, echo.Stderr = echoOut, echoOut
	require.NoError(t, echo.Start())
	defer func() {
		_ = echo.Process.Signal(syscall.SIGINT)
		_ = echo.Wait()
		t.Logf("vfnic echo output:\n%s", echoOut.String())
	}()
	for i := 0; !strings.Contains(echoOut.String(), "ready"); i++ {
		require.Less(t, i, 300, "vfnic echo did not get ready:\n%s", echoOut.String())
		time.Sleep(100 * time.Millisecond)
	}
	ping, err := exec.CommandContext(ctx, "ping", "-c", "20", "-i", "0.2", "-W", "2", echoIP).CombinedOutput()
	t.Logf("ping -c 20 %s (Linux igb on the other NIC):\n%s", echoIP, ping)
	require.NoError(t, err)
	require.Contains(t, string(ping), "20 packets transmitted, 20 packets received")
	udp, err := exec.CommandContext(ctx, vfnicBin, "udpping", "-count", "20", "-size", "512", "-interval", "50ms", echoIP+":7").CombinedOutput()
	t.Logf("vfnic udpping:\n%s", udp)
	require.NoError(t, err)
	require.Contains(t, string(udp), "20 sent, 20 echoed intact, 0 lost, 0 corrupted")
}
