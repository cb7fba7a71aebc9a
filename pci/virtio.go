package pci

import "fmt"

// VirtioVendorID is the PCI vendor ID of virtio devices.
const VirtioVendorID = 0x1af4

// Virtio structure types (cfg_type of a virtio_pci_cap).
const (
	VirtioCommonCfg       = 1 // common configuration
	VirtioNotifyCfg       = 2 // notifications
	VirtioISRCfg          = 3 // ISR status
	VirtioDeviceCfg       = 4 // device-specific configuration
	VirtioPCICfg          = 5 // config-space window onto the BARs
	VirtioSharedMemoryCfg = 8 // shared memory region (64-bit offset and length)
	VirtioVendorCfg       = 9 // vendor data
)

// VirtioCap is a decoded virtio_pci_cap: a vendor-specific capability that
// tells a virtio driver where in which BAR a configuration structure lives.
type VirtioCap struct {
	CapOffset int   // where the capability sits in config space
	CfgType   uint8 // one of the Virtio*Cfg constants; drivers ignore unknown types
	Bar       uint8 // BAR index; values above 5 are reserved and must be ignored
	ID        uint8 // distinguishes several capabilities of one type
	Offset    uint64
	Length    uint64
	// NotifyOffMultiplier is the notify structure's queue stride
	// (cfg_type 2 only).
	NotifyOffMultiplier uint32
}

// Layout of struct virtio_pci_cap and its extensions.
const (
	virtioCapLen       = 16 // cap_vndr .. length
	virtioNotifyCapLen = 20 // + notify_off_multiplier
	virtioCap64Len     = 24 // + offset_hi, length_hi (virtio_pci_cap64)
)

// Virtio decodes a vendor-specific capability (ID 0x09) as a virtio_pci_cap.
// Call it only on devices whose vendor is VirtioVendorID: other vendors put
// their own layouts in these capabilities.
func (cp Capability) Virtio() (VirtioCap, error) {
	if err := cp.need(CapVendor, false, 3, "vendor-specific"); err != nil {
		return VirtioCap{}, err
	}
	capLen := int(cp.Body[2])
	short := func(need int) error {
		return fmt.Errorf("%w: virtio capability at 0x%02x: cap_len %d (%d bytes readable), cfg_type %d needs %d",
			ErrBadConfig, cp.Offset, capLen, len(cp.Body), cp.bodyByte(3), need)
	}
	if capLen < virtioCapLen || len(cp.Body) < virtioCapLen {
		return VirtioCap{}, short(virtioCapLen)
	}
	b := cp.Body
	v := VirtioCap{
		CapOffset: cp.Offset,
		CfgType:   b[3],
		Bar:       b[4],
		ID:        b[5],
		Offset:    uint64(le32(b, 8)),
		Length:    uint64(le32(b, 12)),
	}
	switch v.CfgType {
	case VirtioNotifyCfg:
		if capLen < virtioNotifyCapLen || len(b) < virtioNotifyCapLen {
			return VirtioCap{}, short(virtioNotifyCapLen)
		}
		v.NotifyOffMultiplier = le32(b, 16)
	case VirtioSharedMemoryCfg:
		if capLen < virtioCap64Len || len(b) < virtioCap64Len {
			return VirtioCap{}, short(virtioCap64Len)
		}
		v.Offset |= uint64(le32(b, 16)) << 32
		v.Length |= uint64(le32(b, 20)) << 32
	}
	return v, nil
}

// bodyByte returns Body[i], 0 when the body is shorter.
func (cp Capability) bodyByte(i int) byte {
	if i < len(cp.Body) {
		return cp.Body[i]
	}
	return 0
}

// VirtioCaps decodes every vendor-specific capability as a virtio_pci_cap,
// in list order. It fails on the first malformed one. Call it only on
// virtio devices (VendorID == VirtioVendorID).
func (c *Config) VirtioCaps() ([]VirtioCap, error) {
	var out []VirtioCap
	for _, cp := range c.Capabilities {
		if cp.Extended || cp.ID != CapVendor {
			continue
		}
		v, err := cp.Virtio()
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// VirtioStructures picks, from decoded virtio capabilities, the first
// usable one of each structure type a driver maps (VirtioCommonCfg,
// VirtioNotifyCfg, VirtioISRCfg, VirtioDeviceCfg), as the virtio
// specification asks drivers to. Other types (PCI_CFG names a BAR with
// length 0), reserved BARs (above 5) and empty structures are skipped.
func VirtioStructures(caps []VirtioCap) map[uint8]VirtioCap {
	found := map[uint8]VirtioCap{}
	for _, c := range caps {
		if c.CfgType < VirtioCommonCfg || c.CfgType > VirtioDeviceCfg || c.Bar > 5 || c.Length == 0 {
			continue
		}
		if _, dup := found[c.CfgType]; !dup {
			found[c.CfgType] = c
		}
	}
	return found
}
