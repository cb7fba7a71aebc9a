package igb

// Register offsets in BAR0 and their bits, as named in the 82576 datasheet
// (section 8) and in Linux's e1000_regs.h / e1000_defines.h and DPDK's
// e1000 base code. Queue registers use the layout that covers all 16
// queues (0xC000/0xE000 + 0x40*n); the 0x2800/0x3800 aliases of queues
// 0-3 are not used.
const (
	regCTRL     = 0x0000
	regSTATUS   = 0x0008
	regCTRLEXT  = 0x0018
	regICR      = 0x00C0
	regIMS      = 0x00D0
	regIMC      = 0x00D8
	regRCTL     = 0x0100
	regTCTL     = 0x0400
	regGPIE     = 0x1514
	regEICS     = 0x1520
	regEIMS     = 0x1524
	regEIMC     = 0x1528
	regEIAC     = 0x152C
	regEIAM     = 0x1530
	regEICR     = 0x1580
	regEITR0    = 0x1680 // EITR(n) = regEITR0 + 4n
	regIVAR0    = 0x1700 // IVAR(n) = regIVAR0 + 4n
	regIVARMISC = 0x1740
	regRXCSUM   = 0x5000
	regRLPML    = 0x5004
	regRAL0     = 0x5400 // RAL(n) = regRAL0 + 8n
	regRAH0     = 0x5404 // RAH(n) = regRAH0 + 8n
	regMRQC     = 0x5818

	regRDBAL0  = 0xC000 // receive queue n at + 0x40n
	regRDBAH0  = 0xC004
	regRDLEN0  = 0xC008
	regSRRCTL0 = 0xC00C
	regRDH0    = 0xC010
	regRDT0    = 0xC018
	regRXDCTL0 = 0xC028

	regTDBAL0  = 0xE000 // transmit queue n at + 0x40n
	regTDBAH0  = 0xE004
	regTDLEN0  = 0xE008
	regTDH0    = 0xE010
	regTDT0    = 0xE018
	regTXDCTL0 = 0xE028
	regTDWBAL0 = 0xE038

	queueStride = 0x40

	// bar0Size is the smallest BAR0 that holds every register used.
	bar0Size = 0x10000
)

// rxReg and txReg return queue n's copy of a per-queue register.
func rxReg(r0 uint32, n int) uint32 { return r0 + uint32(n)*queueStride }
func txReg(r0 uint32, n int) uint32 { return r0 + uint32(n)*queueStride }

// CTRL bits.
const (
	ctrlFD     = 1 << 0  // full duplex
	ctrlSLU    = 1 << 6  // set link up
	ctrlFrcSpd = 1 << 11 // force speed
	ctrlFrcDpx = 1 << 12 // force duplex
	ctrlRST    = 1 << 26 // device reset, self-clearing
	ctrlVME    = 1 << 30 // VLAN mode enable (strip)
	ctrlPHYRS  = 1 << 31 // PHY reset
)

// STATUS bits.
const (
	statusFD        = 1 << 0
	statusLU        = 1 << 1
	statusSpeedMask = 3 << 6
	statusSpeed100  = 1 << 6
	statusSpeed1000 = 2 << 6
)

// CTRL_EXT bits.
const ctrlExtDrvLoad = 1 << 28 // the driver has taken the device

// Interrupt causes (ICR/IMS/IMC).
const icrLSC = 1 << 2 // link status change

// RCTL bits.
const (
	rctlEN    = 1 << 1
	rctlSBP   = 1 << 2 // store bad packets
	rctlUPE   = 1 << 3 // unicast promiscuous
	rctlMPE   = 1 << 4 // multicast promiscuous
	rctlLPE   = 1 << 5 // long packet enable
	rctlBAM   = 1 << 15
	rctlSECRC = 1 << 26 // strip the Ethernet CRC
)

// TCTL bits and fields.
const (
	tctlEN      = 1 << 1
	tctlPSP     = 1 << 3 // pad short packets
	tctlCTShift = 4      // collision threshold
	tctlCOLDSh  = 12     // collision distance
	tctlRTLC    = 1 << 24
)

// SRRCTL fields.
const (
	srrctlBSizePktShift = 10 // BSIZEPACKET in 1 KiB units, bits 0-6
	srrctlBSizeHdrShift = 2  // BSIZEHEADER in 64-byte units, bits 8-11 (value << 2 as Linux writes it)
	srrctlDescAdvOne    = 1 << 25
	srrctlDropEn        = 1 << 31
)

// RXDCTL/TXDCTL: thresholds in bits 0-4, 8-12, 16-20, and the enable bit.
const (
	dctlEnable = 1 << 25
)

// GPIE bits.
const (
	gpieNSICR    = 1 << 0
	gpieMSIXMode = 1 << 4
	gpieEIAME    = 1 << 30
	gpiePBA      = 1 << 31
)

// IVAR entry valid bit.
const ivarValid = 0x80

// EITR: interval in bits 2-14 (the value Linux writes, ~0.25 us units),
// CNT_IGNR so a write does not disturb the running counter.
const (
	eitrIntervalMask = 0x7FFC
	eitrCntIgnr      = 1 << 31
)

// RXCSUM bits.
const (
	rxcsumIPOFL = 1 << 8
	rxcsumTUOFL = 1 << 9
	rxcsumPCSD  = 1 << 13
)

// RAH bit.
const rahAV = 1 << 31 // address valid

// Advanced descriptor bits.
const (
	// Transmit read format, cmd_type_len (offset 8).
	txdCmdEOP    = 1 << 24
	txdCmdIFCS   = 1 << 25
	txdCmdRS     = 1 << 27
	txdCmdDEXT   = 1 << 29
	txdDTypData  = 3 << 20
	txdPaylenSh  = 14     // olinfo_status (offset 12): PAYLEN
	txdIdxSh     = 4      // olinfo_status: the context (0 or 1) the frame uses
	txdPoptsIXSM = 1 << 8 // olinfo_status: insert the IPv4 header checksum
	txdPoptsTXSM = 1 << 9 // olinfo_status: insert the TCP/UDP checksum
	// Transmit context descriptor (datasheet 7.2.2.5; Linux struct
	// e1000_adv_tx_context_desc): vlan_macip_lens at offset 0 (IPLEN bits
	// 0-8, MACLEN 9-15), type_tucmd_mlhl at 8, mss_l4len_idx at 12 (IDX
	// bit 4).
	txcMACLenSh   = 9
	txcDTypCtx    = 2 << 20
	txcTUCmdIPv4  = 1 << 10
	txcTUCmdL4TCP = 1 << 11 // L4T: TCP (UDP is 0)
	txcIdxSh      = 4
	txdStatusDD   = 1 << 0
	rxdStatusDD   = 1 << 0
	rxdStatusEOP  = 1 << 1
)

// Descriptor size and ring limits (82576 datasheet 8.10: RDLEN/TDLEN are
// multiples of 128 bytes, i.e. 8 descriptors; at most 4096 descriptors).
const (
	descSize     = 16
	minRing      = 8
	maxRing      = 4096
	ringAlign    = 128
	maxVectors   = 25  // the 82576's MSI-X table; QEMU's model has 10
	resetTimeout = 100 // milliseconds for CTRL.RST to clear
)

// ivarLayout says where queue q's interrupt vector goes in the IVAR table.
type ivarLayout uint8

const (
	// ivar82576: 8 rows by 2 columns, column-major: row q&7, RX byte at
	// bit 16*(q>>3), TX byte 8 bits above (datasheet 8.8.15, Linux
	// igb_assign_vector's e1000_82576 case).
	ivar82576 ivarLayout = iota + 1
	// ivar82580: two queues per register: row q>>1, RX byte at bit
	// 16*(q&1), TX byte 8 bits above (82580, i350, i210).
	ivar82580
)

// ivarSlot returns the IVAR register index and bit offset of queue q's
// receive (tx false) or transmit entry.
func (l ivarLayout) ivarSlot(q int, tx bool) (reg int, shift uint) {
	switch l {
	case ivar82580:
		reg, shift = q>>1, uint(q&1)*16
	default:
		reg, shift = q&7, uint(q>>3)*16
	}
	if tx {
		shift += 8
	}
	return reg, shift
}

// mac is one row of the per-MAC table: what differs between members of
// the family. Only the 82576 row has been exercised (on QEMU's model).
type mac struct {
	name     string
	deviceID []uint16
	queues   int // RX and TX queues each
	ivar     ivarLayout
	// rstDelayMs is how long to wait after setting CTRL.RST before the
	// first register read (Linux waits 1-2 ms on 82575/82576).
	rstDelayMs int
	// systimBits is the width of the SYSTIM clock (not used yet: PTP).
	systimBits int
	// tested is true for rows exercised on a device (QEMU's model counts):
	// Match takes only those.
	tested bool
}

// macs is the MAC table. Device IDs from Linux e1000_hw.h.
var macs = []mac{
	{name: "82576", deviceID: []uint16{0x10C9, 0x10E6, 0x10E7, 0x10E8, 0x1526, 0x150A, 0x1518, 0x150D},
		queues: 16, ivar: ivar82576, rstDelayMs: 1, systimBits: 64, tested: true},
	// The i350 row is filled from the datasheet and Linux but untested
	// here: QEMU has no i350 model, so the driver does not match it yet
	// (Match takes tested rows only).
	{name: "i350", deviceID: []uint16{0x1521, 0x1522, 0x1523, 0x1524},
		queues: 8, ivar: ivar82580, rstDelayMs: 1, systimBits: 40},
}

// intelVendorID is Intel's PCI vendor ID.
const intelVendorID = 0x8086

// lookupMAC returns the table row of an Intel device ID.
func lookupMAC(deviceID uint16) (*mac, bool) {
	for i := range macs {
		for _, id := range macs[i].deviceID {
			if id == deviceID {
				return &macs[i], true
			}
		}
	}
	return nil, false
}

// RSS registers and MRQC fields (datasheet 8.10.x; Linux E1000_MRQC_*).
const (
	regRETA0    = 0x5C00 // 32 registers of 4 one-byte entries
	regRSSRK0   = 0x5C80 // 10 registers: the 40-byte key
	mrqcRSS     = 0x2    // MRQE: RSS only
	mrqcIPv4TCP = 1 << 16
	mrqcIPv4    = 1 << 17
	mrqcIPv6TCP = 1 << 18
	mrqcIPv6    = 1 << 20
	mrqcIPv4UDP = 1 << 22
	mrqcIPv6UDP = 1 << 23
)

// rssKey is the Toeplitz key: Microsoft's verification key, which DPDK
// and many drivers use by default, so hashes can be checked against
// published values.
var rssKey = [40]byte{
	0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2,
	0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0,
	0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4,
	0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c,
	0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
}

// MDIC: the MDI control register through which the MAC reaches the PHY
// (datasheet 8.2.4; Linux E1000_MDIC_*).
const (
	regMDIC         = 0x0020
	mdicRegShift    = 16
	mdicPhyShift    = 21
	mdicOpWrite     = 1 << 26
	mdicOpRead      = 2 << 26
	mdicReady       = 1 << 28
	mdicError       = 1 << 30
	phyAddr         = 1 // the internal PHY (QEMU's model answers address 1 only)
	phyCtrl         = 0 // PHY_CTRL (MII BMCR)
	phyAutoNegEn    = 1 << 12
	phyRestartAutoN = 1 << 9
)
