package igbvm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/igb"
	"golang.org/x/sys/unix"
)

const rateFor = 2 * time.Second

// sink is a MAC no NIC has: the rate tests' frames are dropped by every
// receiver on their hub.
var sink = []byte{0x02, 0, 0, 0, 0, 0x99}

func frame64(src []byte) []byte {
	f := make([]byte, 60) // 64 on the wire with the FCS the device adds
	copy(f, sink)
	copy(f[6:], src)
	f[12], f[13] = 0x88, 0xb7
	return f
}

// vfnicTxRate busy-sends 64-byte frames on the igb in slot for rateFor
// and returns completed sends per second.
func vfnicTxRate(t *testing.T, slot int) float64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dev, err := igb.Open(ctx, addrOf(slot), igb.Config{})
	require.NoError(t, err)
	defer func() { require.NoError(t, dev.Close()) }()
	tx, err := dev.TxQueue(0)
	require.NoError(t, err)
	f := frame64(dev.MAC())
	comps := make([]nic.Completion, 64)
	done := 0
	t0 := time.Now()
	for time.Since(t0) < rateFor {
		for {
			if err := tx.Send(f, nil); err != nil {
				require.ErrorIs(t, err, nic.ErrFull)
				break
			}
		}
		require.NoError(t, tx.Flush())
		n := tx.Poll(comps)
		for _, c := range comps[:n] {
			require.NoError(t, c.Err)
		}
		done += n
	}
	return float64(done) / time.Since(t0).Seconds()
}

// linuxIface is the guest kernel's interface name of the NIC in slot.
func linuxIface(t *testing.T, slot int) string {
	m, err := filepath.Glob("/sys/bus/pci/devices/" + addrOf(slot) + "/net/*")
	require.NoError(t, err)
	require.Len(t, m, 1, "the Linux igb NIC has one interface")
	return filepath.Base(m[0])
}

func txPackets(t *testing.T, ifname string) uint64 {
	b, err := os.ReadFile("/sys/class/net/" + ifname + "/statistics/tx_packets")
	require.NoError(t, err)
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	require.NoError(t, err)
	return v
}

// linuxTxRate busy-sends 64-byte frames through an AF_PACKET socket on the
// Linux igb interface for rateFor and returns the frames the driver
// counted as sent per second (tx_packets).
func linuxTxRate(t *testing.T, ifname string) float64 {
	ifi, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
	require.NoError(t, err)
	defer unix.Close(ifi)
	iface, err := netInterface(ifname)
	require.NoError(t, err)
	sa := &unix.SockaddrLinklayer{Ifindex: iface.index, Halen: 6}
	copy(sa.Addr[:], sink)
	f := frame64(iface.mac)
	p0 := txPackets(t, ifname)
	t0 := time.Now()
	for time.Since(t0) < rateFor {
		if err := unix.Sendto(ifi, f, 0, sa); err != nil && !errors.Is(err, unix.ENOBUFS) && !errors.Is(err, unix.EAGAIN) {
			require.NoError(t, err)
		}
	}
	el := time.Since(t0)
	time.Sleep(50 * time.Millisecond) // the queue drains
	return float64(txPackets(t, ifname)-p0) / el.Seconds()
}

type ifInfo struct {
	index int
	mac   []byte
}

func netInterface(name string) (ifInfo, error) {
	b, err := os.ReadFile("/sys/class/net/" + name + "/ifindex")
	if err != nil {
		return ifInfo{}, err
	}
	idx, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return ifInfo{}, err
	}
	m, err := os.ReadFile("/sys/class/net/" + name + "/address")
	if err != nil {
		return ifInfo{}, err
	}
	var mac []byte
	for _, h := range strings.Split(strings.TrimSpace(string(m)), ":") {
		v, err := strconv.ParseUint(h, 16, 8)
		if err != nil {
			return ifInfo{}, err
		}
		mac = append(mac, byte(v))
	}
	return ifInfo{index: idx, mac: mac}, nil
}

// TestGuestTxRateComparison sets vfnic's 64-byte transmit rate on QEMU's
// igb beside the guest Linux igb driver's (AF_PACKET), same guest, same
// run, alternating A B A B. vfnic sends on the igb in slot 2 (hub 0), Linux
// on the igb in slot 8 (hub 1); each hub delivers to one other NIC and
// hub 0 also to the host's socket. The test asserts only that both send;
// the figures are for the report.
func TestGuestTxRateComparison(t *testing.T) {
	guestOnly(t)
	ifname := linuxIface(t, slotLinux)
	var v, l []float64
	for round := 0; round < 2; round++ {
		v = append(v, vfnicTxRate(t, confHubs[0].slotA))
		l = append(l, linuxTxRate(t, ifname))
	}
	t.Logf("64-byte TX frames/s over %v runs, A B A B: vfnic-igb %.0f, %.0f; Linux igb (AF_PACKET, tx_packets) %.0f, %.0f",
		rateFor, v[0], v[1], l[0], l[1])
	for i := range v {
		require.Positive(t, v[i])
		require.Positive(t, l[i])
	}
}
