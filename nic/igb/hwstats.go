package igb

import (
	"github.com/vfnic/vfnic/nic"
)

// HWStats are the 82576's own statistics registers (datasheet 8.19, the
// ones Linux's igb_update_stats reads), summed since Open: what the MAC
// counted, including the frames the driver never saw (missed for want of
// a descriptor, refused as malformed). The registers clear when read;
// the device adds each read to these totals, so that every caller sees
// counts since Open. QEMU's model keeps the good/broadcast/multicast,
// total, size and undersize counters; it holds a frame back rather than
// drop it when a ring is full, so its Missed and NoBuffer stay 0.
type HWStats struct {
	RxGood           uint64 `json:"rx_good"`           // GPRC: frames received and accepted
	RxGoodBytes      uint64 `json:"rx_good_bytes"`     // GORC, FCS included
	RxTotal          uint64 `json:"rx_total"`          // TPR: frames received, bad ones included
	RxBroadcast      uint64 `json:"rx_broadcast"`      // BPRC
	RxMulticast      uint64 `json:"rx_multicast"`      // MPRC
	Missed           uint64 `json:"rx_missed"`         // MPC: dropped, no room in the packet buffer
	NoBuffer         uint64 `json:"rx_no_buffer"`      // RNBC: no receive descriptor free (the frame may still arrive later)
	CRCErrors        uint64 `json:"rx_crc_errors"`     // CRCERRS
	AlignErrors      uint64 `json:"rx_align_errors"`   // ALGNERRC
	SymbolErrors     uint64 `json:"rx_symbol_errors"`  // SYMERRS
	RxErrors         uint64 `json:"rx_errors"`         // RXERRC
	LengthErrors     uint64 `json:"rx_length_errors"`  // RLEC
	Undersize        uint64 `json:"rx_undersize"`      // RUC: shorter than 64 bytes, valid CRC
	Fragments        uint64 `json:"rx_fragments"`      // RFC: shorter than 64 bytes, bad CRC
	Oversize         uint64 `json:"rx_oversize"`       // ROC: longer than the largest frame, valid CRC
	Jabbers          uint64 `json:"rx_jabbers"`        // RJC: longer, bad CRC
	TxGood           uint64 `json:"tx_good"`           // GPTC
	TxGoodBytes      uint64 `json:"tx_good_bytes"`     // GOTC, FCS included
	TxTotal          uint64 `json:"tx_total"`          // TPT
	TxBroadcast      uint64 `json:"tx_broadcast"`      // BPTC
	TxMulticast      uint64 `json:"tx_multicast"`      // MPTC
	TxTSO            uint64 `json:"tx_tso_contexts"`   // TSCTC
	Collisions       uint64 `json:"collisions"`        // COLC
	LateCollisions   uint64 `json:"late_collisions"`   // LATECOL
	ExcessCollisions uint64 `json:"excess_collisions"` // ECOL
	Deferred         uint64 `json:"tx_deferred"`       // DC
	XONRx            uint64 `json:"xon_rx"`            // XONRXC
	XONTx            uint64 `json:"xon_tx"`            // XONTXC
	XOFFRx           uint64 `json:"xoff_rx"`           // XOFFRXC
	XOFFTx           uint64 `json:"xoff_tx"`           // XOFFTXC
}

// Statistics register offsets (datasheet 8.19; Linux e1000_regs.h).
const (
	regCRCERRS  = 0x4000
	regALGNERRC = 0x4004
	regSYMERRS  = 0x4008
	regRXERRC   = 0x400C
	regMPC      = 0x4010
	regECOL     = 0x4018
	regLATECOL  = 0x4020
	regCOLC     = 0x4028
	regDC       = 0x4030
	regRLEC     = 0x4040
	regXONRXC   = 0x4048
	regXONTXC   = 0x404C
	regXOFFRXC  = 0x4050
	regXOFFTXC  = 0x4054
	regGPRC     = 0x4074
	regBPRC     = 0x4078
	regMPRC     = 0x407C
	regGPTC     = 0x4080
	regGORCL    = 0x4088 // GORCH at +4: reading it clears both halves
	regGOTCL    = 0x4090
	regRNBC     = 0x40A0
	regRUC      = 0x40A4
	regRFC      = 0x40A8
	regROC      = 0x40AC
	regRJC      = 0x40B0
	regTPR      = 0x40D0
	regTPT      = 0x40D4
	regMPTC     = 0x40F0
	regBPTC     = 0x40F4
	regTSCTC    = 0x40F8
)

// counters pairs each 32-bit statistics register with its total.
func (s *HWStats) counters() []struct {
	reg uint32
	sum *uint64
} {
	return []struct {
		reg uint32
		sum *uint64
	}{
		{regGPRC, &s.RxGood}, {regTPR, &s.RxTotal}, {regBPRC, &s.RxBroadcast}, {regMPRC, &s.RxMulticast},
		{regMPC, &s.Missed}, {regRNBC, &s.NoBuffer}, {regCRCERRS, &s.CRCErrors}, {regALGNERRC, &s.AlignErrors},
		{regSYMERRS, &s.SymbolErrors}, {regRXERRC, &s.RxErrors}, {regRLEC, &s.LengthErrors}, {regRUC, &s.Undersize},
		{regRFC, &s.Fragments}, {regROC, &s.Oversize}, {regRJC, &s.Jabbers},
		{regGPTC, &s.TxGood}, {regTPT, &s.TxTotal}, {regBPTC, &s.TxBroadcast}, {regMPTC, &s.TxMulticast},
		{regTSCTC, &s.TxTSO}, {regCOLC, &s.Collisions}, {regLATECOL, &s.LateCollisions}, {regECOL, &s.ExcessCollisions},
		{regDC, &s.Deferred}, {regXONRXC, &s.XONRx}, {regXONTXC, &s.XONTx}, {regXOFFRXC, &s.XOFFRx}, {regXOFFTXC, &s.XOFFTx},
	}
}

// add reads every statistics register once (which clears it) into s.
func (s *HWStats) add(r regFile) {
	for _, c := range s.counters() {
		*c.sum += uint64(r.read(c.reg))
	}
	// The 64-bit byte counters: low half, then the high half, whose read
	// clears both.
	for _, c := range []struct {
		reg uint32
		sum *uint64
	}{{regGORCL, &s.RxGoodBytes}, {regGOTCL, &s.TxGoodBytes}} {
		lo := r.read(c.reg)
		hi := r.read(c.reg + 4)
		*c.sum += uint64(hi)<<32 | uint64(lo)
	}
}

// HWStats reads the statistics registers and returns the totals since
// Open. After Close it returns the totals of the last read and
// nic.ErrClosed.
func (d *Device) HWStats() (HWStats, error) {
	d.core.Mu.Lock()
	defer d.core.Mu.Unlock()
	if d.core.Closed {
		return d.hwTotals, nic.ErrClosed
	}
	d.hwTotals.add(d.regs)
	return d.hwTotals, nil
}

// clearHWStats zeroes the statistics registers (by reading them) and the
// totals: what the device counted before Open is not this open's.
func (d *Device) clearHWStats() {
	d.hwTotals = HWStats{}
	d.hwTotals.add(d.regs)
	d.hwTotals = HWStats{}
}
