package vfio

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Where Linux lists IRQs and takes their affinity; tests point them
// elsewhere.
var (
	procInterrupts = "/proc/interrupts"
	procIRQ        = "/proc/irq"
)

// ErrNoIRQ means an MSI-X vector has no IRQ in the kernel: vfio-pci
// requests one only for a vector wired to an eventfd (EnableMSIX). It
// matches os.ErrNotExist.
var ErrNoIRQ = fmt.Errorf("vfio: no IRQ for the vector: %w", os.ErrNotExist)

// SteerMSIX directs MSI-X vector v's interrupt to cpu, as a kernel
// driver's affinity hint does for its queues: a thread pinned to cpu that
// sleeps on the vector's eventfd is then woken by an interrupt on its own
// CPU, with no inter-processor interrupt on the way. It writes the
// smp_affinity_list of the IRQ vfio-pci requested for the vector (named
// "vfio-msix[v](address)" in /proc/interrupts), which needs root; the
// kernel may still refuse a CPU (an error), and irqbalance may later move
// the IRQ again.
func (d *Device) SteerMSIX(v, cpu int) error {
	if v < 0 || cpu < 0 {
		return fmt.Errorf("vfio: steer MSI-X vector %d of %s to CPU %d: %w", v, d.addr, cpu, ErrOutOfRange)
	}
	irq, err := MSIXIRQ(d.addr, v)
	if err != nil {
		return err
	}
	p := filepath.Join(procIRQ, strconv.Itoa(irq), "smp_affinity_list")
	if err := os.WriteFile(p, []byte(strconv.Itoa(cpu)), 0); err != nil {
		return fmt.Errorf("vfio: steer %s (IRQ %d) to CPU %d: %w", msixName(d.addr, v), irq, cpu, unwrapPath(err))
	}
	return nil
}

// MSIXIRQ returns the Linux IRQ that vfio-pci requested for MSI-X vector v
// of the device at addr (as OpenDevice names it): ErrNoIRQ when there is
// none, as for a vector not wired to an eventfd.
func MSIXIRQ(addr string, v int) (int, error) {
	name := msixName(addr, v)
	data, err := os.ReadFile(procInterrupts)
	if err != nil {
		return 0, fmt.Errorf("vfio: IRQ of %s: %w", name, err)
	}
	irq, ok := findIRQ(data, name)
	if !ok {
		return 0, fmt.Errorf("vfio: IRQ of %s: %w", name, ErrNoIRQ)
	}
	return irq, nil
}

// msixName is the name vfio-pci gives the IRQ of MSI-X vector v.
func msixName(addr string, v int) string { return fmt.Sprintf("vfio-msix[%d](%s)", v, addr) }

// unwrapPath drops os.PathError's "write /proc/...:" prefix, which the
// message already says, keeping the errno for errors.Is.
func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// findIRQ returns the number of the IRQ whose action is named name in a
// /proc/interrupts listing: "  NN:  counts...  chip hwirq-edge  name".
func findIRQ(listing []byte, name string) (int, bool) {
	sc := bufio.NewScanner(bytes.NewReader(listing))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[len(f)-1] != name {
			continue
		}
		n, ok := strings.CutSuffix(f[0], ":")
		if !ok {
			continue
		}
		if irq, err := strconv.Atoi(n); err == nil && irq >= 0 {
			return irq, true
		}
	}
	return 0, false
}
