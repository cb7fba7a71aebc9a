package virtio

import (
	"fmt"
	"math/bits"
	"strings"
)

// virtio_pci_common_cfg offsets (VIRTIO 1.x, 4.1.4.3).
const (
	regDeviceFeatureSelect = 0x00
	regDeviceFeature       = 0x04
	regDriverFeatureSelect = 0x08
	regDriverFeature       = 0x0c
	regConfigMSIXVector    = 0x10
	regNumQueues           = 0x12
	regDeviceStatus        = 0x14
	regConfigGeneration    = 0x15
	regQueueSelect         = 0x16
	regQueueSize           = 0x18
	regQueueMSIXVector     = 0x1a
	regQueueEnable         = 0x1c
	regQueueNotifyOff      = 0x1e
	regQueueDesc           = 0x20
	regQueueDriver         = 0x28
	regQueueDevice         = 0x30
	commonCfgMinLen        = 0x38
)

// Device status bits.
const (
	statusAcknowledge      = 1
	statusDriver           = 2
	statusDriverOK         = 4
	statusFeaturesOK       = 8
	statusDeviceNeedsReset = 64
	statusFailed           = 128
)

// noVector tells the device not to use MSI-X for a queue or config changes.
const noVector = 0xffff

// maxQueuePairs is the spec's bound on max_virtqueue_pairs.
const maxQueuePairs = 0x8000

// virtio_net_config offsets (5.1.4).
const (
	netCfgMAC       = 0
	netCfgStatus    = 6
	netCfgMaxPairs  = 8
	netCfgMTU       = 10
	netCfgSpeed     = 12
	netCfgDuplex    = 16
	netStatusLinkUp = 1
	netDuplexFull   = 1
	netSpeedUnknown = 0xffffffff
)

// Feature bits.
const (
	FeatureCsum          = 0  // VIRTIO_NET_F_CSUM: the device fills in checksums the driver left (NEEDS_CSUM)
	FeatureGuestCsum     = 1  // VIRTIO_NET_F_GUEST_CSUM: received frames say DATA_VALID or NEEDS_CSUM
	FeatureMTU           = 3  // VIRTIO_NET_F_MTU: the device reports its MTU
	FeatureMAC           = 5  // VIRTIO_NET_F_MAC: the device has a MAC address
	FeatureMrgRxBuf      = 15 // VIRTIO_NET_F_MRG_RXBUF: frames may span buffers
	FeatureStatus        = 16 // VIRTIO_NET_F_STATUS: link status in config space
	FeatureCtrlVQ        = 17 // VIRTIO_NET_F_CTRL_VQ: control virtqueue
	FeatureCtrlRx        = 18 // VIRTIO_NET_F_CTRL_RX: receive mode control
	FeatureMQ            = 22 // VIRTIO_NET_F_MQ: several queue pairs
	FeatureEventIdx      = 29 // VIRTIO_F_RING_EVENT_IDX: event suppression by index
	FeatureVersion1      = 32 // VIRTIO_F_VERSION_1: modern device
	FeatureAccessPlat    = 33 // VIRTIO_F_ACCESS_PLATFORM: DMA goes through the IOMMU
	FeatureRingPacked    = 34 // VIRTIO_F_RING_PACKED: packed virtqueues
	FeatureSpeedDuplex   = 63 // VIRTIO_NET_F_SPEED_DUPLEX: speed and duplex in config
	featureIndirectDesc  = 28
	featureInOrder       = 35
	featureNotifyData    = 38
	featureGuestAnnounce = 21
)

var featureNames = map[int]string{
	FeatureCsum: "CSUM", FeatureGuestCsum: "GUEST_CSUM", 2: "CTRL_GUEST_OFFLOADS", FeatureMTU: "MTU",
	FeatureMAC: "MAC", 7: "GUEST_TSO4", 8: "GUEST_TSO6", 9: "GUEST_ECN", 10: "GUEST_UFO",
	11: "HOST_TSO4", 12: "HOST_TSO6", 13: "HOST_ECN", 14: "HOST_UFO",
	FeatureMrgRxBuf: "MRG_RXBUF", FeatureStatus: "STATUS", FeatureCtrlVQ: "CTRL_VQ",
	FeatureCtrlRx: "CTRL_RX", 19: "CTRL_VLAN", featureGuestAnnounce: "GUEST_ANNOUNCE",
	FeatureMQ: "MQ", 23: "CTRL_MAC_ADDR", 24: "NOTIFY_ON_EMPTY", 27: "ANY_LAYOUT",
	featureIndirectDesc: "RING_INDIRECT_DESC", FeatureEventIdx: "RING_EVENT_IDX",
	FeatureVersion1: "VERSION_1", FeatureAccessPlat: "ACCESS_PLATFORM",
	FeatureRingPacked: "RING_PACKED", featureInOrder: "IN_ORDER", 36: "ORDER_PLATFORM",
	37: "SR_IOV", featureNotifyData: "NOTIFICATION_DATA", 39: "NOTIF_CONFIG_DATA",
	40: "RING_RESET", 58: "GUEST_USO4", 59: "GUEST_USO6", 60: "HOST_USO",
	61: "HASH_REPORT", 62: "GUEST_HDRLEN", FeatureSpeedDuplex: "SPEED_DUPLEX",
}

// Features is a virtio feature bit set.
type Features uint64

// Has reports whether feature bit b is set.
func (f Features) Has(b int) bool { return f&(1<<uint(b)) != 0 }

// Names lists the set bits by name (BIT<n> for unnamed ones), low bits first.
func (f Features) Names() []string {
	var out []string
	for v := uint64(f); v != 0; v &= v - 1 {
		b := bits.TrailingZeros64(v)
		if n, ok := featureNames[b]; ok {
			out = append(out, n)
		} else {
			out = append(out, fmt.Sprintf("BIT%d", b))
		}
	}
	return out
}

// String lists the set bits by name, separated by '|'.
func (f Features) String() string {
	if f == 0 {
		return "0"
	}
	return strings.Join(f.Names(), "|")
}

func bit(b int) Features { return 1 << uint(b) }

// Virtqueue descriptor flags and event suppression values (2.7, 2.8).
const (
	descNext  = 1
	descWrite = 2
	// Packed ring ownership bits of the 16-bit descriptor flags.
	descAvail = 1 << 7
	descUsed  = 1 << 15
	// Packed ring event suppression flags.
	eventEnable  = 0
	eventDisable = 1
	eventDesc    = 2
	// Split ring flags.
	availNoInterrupt = 1
	usedNoNotify     = 1
	descSize         = 16
)

// netHdrLen is the size of struct virtio_net_hdr with VERSION_1, which
// always carries num_buffers. Every buffer starts with it.
const (
	netHdrLen        = 12
	netHdrNumBuffers = 10
)

// Control virtqueue commands (5.1.6.5).
const (
	ctrlClassRx      = 0
	ctrlRxPromisc    = 0
	ctrlRxAllMulti   = 1
	ctrlClassMQ      = 4
	ctrlMQPairsSet   = 0
	ctrlAckOK        = 0
	maxCtrlQueueSize = 64
)

// PCI IDs of virtio-net.
const (
	pciDeviceNetModern       = 0x1041
	pciDeviceNetTransitional = 0x1000
)
