package vfio

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// A guest's /proc/interrupts while vfnic holds a virtio-net NIC (QEMU 10,
// Linux 6.1), cut to the lines that matter.
const interruptsListing = `           CPU0       CPU1
  0:         44          0   IO-APIC   2-edge      timer
 24:          0          0   PCI-MSI 49152-edge      aerdrv
 25:          3         21  IR-PCI-MSI 65536-edge      vfio-msix[0](0000:00:04.0)
 26:       5120          0  IR-PCI-MSI 65537-edge      vfio-msix[1](0000:00:04.0)
 27:          0        881  IR-PCI-MSI 65538-edge      vfio-msix[2](0000:00:04.0)
 31:          0          0  IR-PCI-MSI 81921-edge      vfio-msix[1](0000:00:05.0)
NMI:          0          0   Non-maskable interrupts
LOC:       2345       2211   Local timer interrupts
`

func TestFindIRQ(t *testing.T) {
	for name, want := range map[string]int{
		"vfio-msix[0](0000:00:04.0)": 25,
		"vfio-msix[1](0000:00:04.0)": 26,
		"vfio-msix[1](0000:00:05.0)": 31,
		"timer":                      0,
	} {
		irq, ok := findIRQ([]byte(interruptsListing), name)
		require.True(t, ok, name)
		require.Equal(t, want, irq, name)
	}
	for _, name := range []string{"vfio-msix[3](0000:00:04.0)", "vfio-msix[1](0000:00:04.", "Local timer interrupts", "interrupts", ""} {
		_, ok := findIRQ([]byte(interruptsListing), name)
		require.False(t, ok, "%q", name)
	}
}

func TestSteerMSIX(t *testing.T) {
	dir := t.TempDir()
	oldList, oldIRQ := procInterrupts, procIRQ
	t.Cleanup(func() { procInterrupts, procIRQ = oldList, oldIRQ })
	procInterrupts, procIRQ = filepath.Join(dir, "interrupts"), filepath.Join(dir, "irq")
	require.NoError(t, os.WriteFile(procInterrupts, []byte(interruptsListing), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(procIRQ, "26"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(procIRQ, "26", "smp_affinity_list"), []byte("0-1\n"), 0o644))

	d := &Device{addr: "0000:00:04.0"}
	require.NoError(t, d.SteerMSIX(1, 1))
	got, err := os.ReadFile(filepath.Join(procIRQ, "26", "smp_affinity_list"))
	require.NoError(t, err)
	require.Equal(t, "1", string(got))

	err = d.SteerMSIX(5, 1)
	require.ErrorIs(t, err, ErrNoIRQ, "a vector without an IRQ")
	require.ErrorIs(t, err, os.ErrNotExist)
	require.Contains(t, err.Error(), "vfio-msix[5](0000:00:04.0)")

	err = d.SteerMSIX(2, 1) // listed, but no /proc/irq/27 here
	require.ErrorIs(t, err, os.ErrNotExist)
	require.Contains(t, err.Error(), "(IRQ 27) to CPU 1")

	require.ErrorIs(t, d.SteerMSIX(-1, 0), ErrOutOfRange)
	require.ErrorIs(t, d.SteerMSIX(1, -1), ErrOutOfRange)

	procInterrupts = filepath.Join(dir, "missing")
	require.True(t, errors.Is(d.SteerMSIX(1, 1), os.ErrNotExist))
}
