package main

import (
	"fmt"
	"strings"

	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/igb"
)

// hwStatser is a device with statistics registers of its own (igb's).
type hwStatser interface {
	HWStats() (igb.HWStats, error)
}

// hardwareCounters reads dev's own counters: the statistics, or nil and
// why there are none (virtio-net's device keeps no counters the driver
// could read; the driver's own are in the summary).
func hardwareCounters(dev nic.Device) (*igb.HWStats, string) {
	h, ok := dev.(hwStatser)
	if !ok {
		return nil, fmt.Sprintf("%s has no statistics registers: only the driver's counters", dev.Info().Driver)
	}
	s, err := h.HWStats()
	if err != nil {
		return nil, "statistics registers not read: " + err.Error()
	}
	return &s, ""
}

// hardwareText is the human form: the drop and error counters always,
// the others when not zero.
func hardwareText(s *igb.HWStats, note string) string {
	if s == nil {
		return note
	}
	t := fmt.Sprintf("rx good %d (%d bytes), missed %d, no buffer %d, crc errors %d, undersize %d, oversize %d; tx good %d (%d bytes)",
		s.RxGood, s.RxGoodBytes, s.Missed, s.NoBuffer, s.CRCErrors, s.Undersize, s.Oversize, s.TxGood, s.TxGoodBytes)
	var more []string
	for _, c := range []struct {
		name string
		n    uint64
	}{
		{"rx total", s.RxTotal}, {"rx broadcast", s.RxBroadcast}, {"rx multicast", s.RxMulticast},
		{"alignment errors", s.AlignErrors}, {"symbol errors", s.SymbolErrors}, {"rx errors", s.RxErrors},
		{"length errors", s.LengthErrors}, {"fragments", s.Fragments}, {"jabbers", s.Jabbers},
		{"tx total", s.TxTotal}, {"tx broadcast", s.TxBroadcast}, {"tx multicast", s.TxMulticast}, {"tso contexts", s.TxTSO},
		{"collisions", s.Collisions}, {"late collisions", s.LateCollisions}, {"excess collisions", s.ExcessCollisions},
		{"deferred", s.Deferred}, {"xon rx", s.XONRx}, {"xon tx", s.XONTx}, {"xoff rx", s.XOFFRx}, {"xoff tx", s.XOFFTx},
	} {
		if c.n != 0 {
			more = append(more, fmt.Sprintf("%s %d", c.name, c.n))
		}
	}
	if len(more) > 0 {
		t += "; " + strings.Join(more, ", ")
	}
	return t
}
