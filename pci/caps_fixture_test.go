package pci

import "encoding/binary"

// Configuration-space fixtures, built field by field from the register
// layouts so that each test can say what it expects.

type cfgBuf []byte

func (b cfgBuf) u8(off int, v uint8)   { b[off] = v }
func (b cfgBuf) u16(off int, v uint16) { binary.LittleEndian.PutUint16(b[off:], v) }
func (b cfgBuf) u32(off int, v uint32) { binary.LittleEndian.PutUint32(b[off:], v) }

// header fills a type 0 header with the capabilities-list status bit set
// when capPtr is not zero.
func header(size int, vendor, device uint16, class uint32, rev uint8, capPtr uint8) cfgBuf {
	b := make(cfgBuf, size)
	b.u16(0x00, vendor)
	b.u16(0x02, device)
	b.u16(0x04, 0x0406) // memory space, bus master, INTx disable
	if capPtr != 0 {
		b.u16(0x06, statusCapList)
	}
	b.u8(0x08, rev)
	b.u8(0x09, uint8(class))
	b.u8(0x0a, uint8(class>>8))
	b.u8(0x0b, uint8(class>>16))
	b.u8(0x34, capPtr)
	return b
}

// virtioCap writes a virtio_pci_cap (capLen 16, 20 for notify).
func (b cfgBuf) virtioCap(off int, next uint8, cfgType, bar uint8, offset, length uint32, mult uint32) {
	capLen := uint8(16)
	if cfgType == VirtioNotifyCfg || cfgType == VirtioPCICfg {
		capLen = 20 // notify multiplier, or virtio_pci_cfg_cap's data window
	}
	b.u8(off, CapVendor)
	b.u8(off+1, next)
	b.u8(off+2, capLen)
	b.u8(off+3, cfgType)
	b.u8(off+4, bar)
	b.u32(off+8, offset)
	b.u32(off+12, length)
	if cfgType == VirtioNotifyCfg {
		b.u32(off+16, mult)
	}
}

// extCap writes an extended capability header.
func (b cfgBuf) extCap(off int, id uint16, version uint8, next int) {
	b.u32(off, uint32(id)|uint32(version)<<16|uint32(next)<<20)
}

// virtioNetConfig is a modern virtio-net function behind a PCIe root port,
// laid out as QEMU builds it (virtio-net-pci,disable-legacy=on,ats=on):
// 0x34 -> PM 0xe0 -> PCIe 0xa4 -> MSI-X 0x98 -> virtio PCI_CFG 0x84 ->
// notify 0x70 -> device 0x60 -> ISR 0x50 -> common 0x40, then ATS at 0x100.
// BAR1 is 32-bit memory (MSI-X), BAR4/5 a 64-bit prefetchable BAR.
func virtioNetConfig() cfgBuf {
	b := header(4096, VirtioVendorID, 0x1041, 0x020000, 1, 0xe0)
	b.u16(0x2c, VirtioVendorID)
	b.u16(0x2e, 0x1100)
	b.u32(0x14, 0xfea00000)    // BAR1
	b.u32(0x20, 0xfe00000c)    // BAR4: 64-bit, prefetchable
	b.u32(0x24, 0x00000000)    // BAR5: upper half
	b.u8(0xe0, CapPM)          // PM
	b.u8(0xe1, 0xa4)           //
	b.u16(0xe2, 0x0003)        // PM version 3
	b.u8(0xa4, CapPCIe)        // PCIe v2 endpoint
	b.u8(0xa5, 0x98)           //
	b.u16(0xa6, 0x0002)        //
	b.u32(0xa8, 1<<28)         // devcap: FLR, MPS 128
	b.u16(0xac, 0x2000|0x0000) // devctl: MRRS 512, MPS 128
	b.u32(0xb0, 0x00000011)    // linkcap: 2.5 GT/s x1
	b.u16(0xb6, 0x0011)        // linksta: 2.5 GT/s x1
	b.u8(0x98, CapMSIX)        // MSI-X, 4 vectors, enabled
	b.u8(0x99, 0x84)           //
	b.u16(0x9a, 0x8003)        //
	b.u32(0x9c, 0x00000001)    // table: BAR1 + 0
	b.u32(0xa0, 0x00000801)    // PBA: BAR1 + 0x800
	b.virtioCap(0x84, 0x70, VirtioPCICfg, 0, 0, 0, 0)
	b.virtioCap(0x70, 0x60, VirtioNotifyCfg, 4, 0x3000, 0x1000, 4)
	b.virtioCap(0x60, 0x50, VirtioDeviceCfg, 4, 0x2000, 0x1000, 0)
	b.virtioCap(0x50, 0x40, VirtioISRCfg, 4, 0x1000, 0x1000, 0)
	b.virtioCap(0x40, 0x00, VirtioCommonCfg, 4, 0x0000, 0x1000, 0)
	b.extCap(0x100, 0x000f, 1, 0) // ATS
	return b
}

const virtioNetResource = "" +
	"0x0000000000000000 0x0000000000000000 0x0000000000000000\n" +
	"0x00000000fea00000 0x00000000fea00fff 0x0000000000040200\n" +
	"0x0000000000000000 0x0000000000000000 0x0000000000000000\n" +
	"0x0000000000000000 0x0000000000000000 0x0000000000000000\n" +
	"0x00000000fe000000 0x00000000fe003fff 0x000000000014220c\n" +
	"0x0000000000000000 0x0000000000000000 0x0000000000000000\n" +
	"0x00000000feb80000 0x00000000febbffff 0x0000000000046200\n"

// e1000eConfig is an Intel 82574L as QEMU's e1000e shows it:
// 0x34 -> PM 0xc8 -> MSI 0xd0 (64-bit, 1 vector) -> PCIe v1 0xe0 ->
// MSI-X 0xa0 (5 vectors, BAR3), then AER 0x100 -> DSN 0x140.
func e1000eConfig() cfgBuf {
	b := header(4096, 0x8086, 0x10d3, 0x020000, 0, 0xc8)
	b.u32(0x10, 0xfebc0000) // BAR0: 128K registers
	b.u32(0x14, 0xfeb00000) // BAR1: 512K flash
	b.u32(0x18, 0x0000c041) // BAR2: I/O ports
	b.u32(0x1c, 0xfebe0000) // BAR3: 16K MSI-X
	b.u16(0x2c, 0x8086)
	b.u8(0xc8, CapPM)
	b.u8(0xc9, 0xd0)
	b.u16(0xca, 0xc822)
	b.u8(0xd0, CapMSI)
	b.u8(0xd1, 0xe0)
	b.u16(0xd2, 0x0080) // 64-bit, 1 vector, disabled
	b.u32(0xd4, 0xfee00000)
	b.u32(0xd8, 0x00000001)
	b.u16(0xdc, 0x4021)
	b.u8(0xe0, CapPCIe)
	b.u8(0xe1, 0xa0)
	b.u16(0xe2, 0x0001)     // version 1 endpoint
	b.u32(0xe4, 1<<28|0x1)  // FLR, MPS 256 supported
	b.u16(0xe8, 0x2000)     // MRRS 512, MPS 128
	b.u32(0xec, 0x00000411) // 2.5 GT/s x1
	b.u16(0xf2, 0x0011)
	b.u8(0xa0, CapMSIX)
	b.u8(0xa1, 0x00)
	b.u16(0xa2, 0x0004) // 5 vectors, disabled
	b.u32(0xa4, 0x00000003)
	b.u32(0xa8, 0x00002003)
	b.extCap(0x100, ExtCapAER, 1, 0x140)
	b.extCap(0x140, ExtCapDSN, 1, 0)
	b.u32(0x144, 0xffaabbcc) // serial, low dword
	b.u32(0x148, 0x00112233) // serial, high dword
	return b
}

const e1000eResource = "" +
	"0x00000000febc0000 0x00000000febdffff 0x0000000000040200\n" +
	"0x00000000feb00000 0x00000000feb7ffff 0x0000000000040200\n" +
	"0x000000000000c040 0x000000000000c05f 0x0000000000040101\n" +
	"0x00000000febe0000 0x00000000febe3fff 0x0000000000040200\n" +
	"0x0000000000000000 0x0000000000000000 0x0000000000000000\n" +
	"0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
