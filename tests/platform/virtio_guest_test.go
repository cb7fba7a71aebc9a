package platform

import (
	"bytes"
	"context"
	"encoding/binary"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/dma"
	"github.com/vfnic/vfnic/doorbell"
	"github.com/vfnic/vfnic/hugepage"
	"github.com/vfnic/vfnic/pci"
	"github.com/vfnic/vfnic/vfio"
)

// FramePrefix starts the payload of every frame TestVM sends to the guest's
// virtio NIC; the guest test checks it in what arrived by DMA.
const FramePrefix = "VFNIC-PLATFORM-TEST"

// virtio_pci_common_cfg offsets.
const (
	vcDeviceFeatureSelect = 0x00
	vcDeviceFeature       = 0x04
	vcDriverFeatureSelect = 0x08
	vcDriverFeature       = 0x0c
	vcConfigMSIXVector    = 0x10
	vcNumQueues           = 0x12
	vcStatus              = 0x14
	vcQueueSelect         = 0x16
	vcQueueSize           = 0x18
	vcQueueMSIXVector     = 0x1a
	vcQueueEnable         = 0x1c
	vcQueueNotifyOff      = 0x1e
	vcQueueDesc           = 0x20
	vcQueueDriver         = 0x28
	vcQueueDevice         = 0x30

	statusAck         = 1
	statusDriver      = 2
	statusDriverOK    = 4
	statusFeaturesOK  = 8
	noVector          = 0xffff
	descFlagWrite     = 2
	virtioNetHdrLen   = 12 // VERSION_1 always carries num_buffers
	featVersion1Hi    = 1 << 0
	featAccessPlatfHi = 1 << 1
	featRingPackedHi  = 1 << 2
)

// TestGuestVirtioMSIX brings up the minimum of a modern virtio-net device by
// hand: one split receive queue in 2 MiB of hugepage memory at an IOVA above
// guest RAM, its MSI-X vector wired to an eventfd. TestVM keeps sending
// frames to the NIC's netdev; one must arrive by DMA through the IOMMU and
// raise the interrupt. (The real driver, with packed rings, is nic/virtio.)
func TestGuestVirtioMSIX(t *testing.T) {
	guestOnly(t)
	before := snapshot(t)
	o := openVFIO(t, addrVirtio)
	w, caps := virtioCommon(t, o)
	common := uintptr(caps[pci.VirtioCommonCfg].Offset)
	notify, ok := caps[pci.VirtioNotifyCfg]
	require.True(t, ok, "notify capability")
	reg8 := func(off uintptr, v uint8) { require.NoError(t, w.Write8(common+off, v)) }
	reg16 := func(off uintptr, v uint16) { require.NoError(t, w.Write16(common+off, v)) }
	reg32 := func(off uintptr, v uint32) { require.NoError(t, w.Write32(common+off, v)) }
	rd8 := func(off uintptr) uint8 { v, err := w.Read8(common + off); require.NoError(t, err); return v }
	rd16 := func(off uintptr) uint16 { v, err := w.Read16(common + off); require.NoError(t, err); return v }
	rd32 := func(off uintptr) uint32 { v, err := w.Read32(common + off); require.NoError(t, err); return v }

	// Reset (the device has no VFIO reset: status 0 is virtio's reset).
	reg8(vcStatus, 0)
	deadline := time.Now().Add(time.Second)
	for rd8(vcStatus) != 0 {
		require.True(t, time.Now().Before(deadline), "reset completes")
	}
	reg8(vcStatus, statusAck)
	reg8(vcStatus, statusAck|statusDriver)
	reg32(vcDeviceFeatureSelect, 1)
	hi := rd32(vcDeviceFeature)
	require.Equal(t, uint32(featVersion1Hi|featAccessPlatfHi), hi&(featVersion1Hi|featAccessPlatfHi))
	reg32(vcDriverFeatureSelect, 0)
	reg32(vcDriverFeature, 0)
	reg32(vcDriverFeatureSelect, 1)
	reg32(vcDriverFeature, featVersion1Hi|featAccessPlatfHi)
	reg8(vcStatus, statusAck|statusDriver|statusFeaturesOK)
	require.NotZero(t, rd8(vcStatus)&statusFeaturesOK, "device accepted VERSION_1|ACCESS_PLATFORM")

	// Every MSI-X vector is wired at once (NORESIZE); queue 0 uses vector 0.
	info, err := o.d.IRQInfo(vfio.IRQMSIX)
	require.NoError(t, err)
	efs, fds := eventfds(t, info.Count)
	require.NoError(t, o.d.EnableMSIX(fds))
	reg16(vcConfigMSIXVector, noVector)

	// DMA memory: 2 MiB hugepage above guest RAM holding the ring and buffers.
	space, err := dma.NewVFIOSpace(o.c, iovaFloor)
	require.NoError(t, err)
	region, err := space.Alloc(2<<20, hugepage.Options{})
	require.NoError(t, err)
	require.GreaterOrEqual(t, region.IOVA(), uint64(iovaFloor))

	const qsize = 64
	reg16(vcQueueSelect, 0) // receiveq1
	require.GreaterOrEqual(t, rd16(vcQueueSize), uint16(qsize))
	reg16(vcQueueSize, qsize)
	reg16(vcQueueMSIXVector, 0)
	require.Equal(t, uint16(0), rd16(vcQueueMSIXVector), "device took vector 0")
	desc, err := region.Carve(16*qsize, 16)
	require.NoError(t, err)
	avail, err := region.Carve(6+2*qsize, 4) // flags, idx, ring, used_event
	require.NoError(t, err)
	used, err := region.Carve(6+8*qsize, 4) // flags, idx, ring, avail_event
	require.NoError(t, err)
	pool, err := dma.NewPool(region, qsize, 2048)
	require.NoError(t, err)
	for off, iova := range map[uintptr]uint64{vcQueueDesc: desc.IOVA, vcQueueDriver: avail.IOVA, vcQueueDevice: used.IOVA} {
		reg32(off, uint32(iova))
		reg32(off+4, uint32(iova>>32))
	}
	notifyOff := rd16(vcQueueNotifyOff)
	reg16(vcQueueEnable, 1)
	reg8(vcStatus, statusAck|statusDriver|statusFeaturesOK|statusDriverOK)

	// Post every buffer, then publish the avail index with one 32-bit store
	// (flags 0 = interrupts wanted, idx in the upper half) and notify.
	for i := 0; i < qsize; i++ {
		idx, ok := pool.Get()
		require.True(t, ok)
		d := desc.Bytes[16*i:]
		binary.LittleEndian.PutUint64(d[0:], pool.Addr(idx))
		binary.LittleEndian.PutUint32(d[8:], uint32(pool.BufSize()))
		binary.LittleEndian.PutUint16(d[12:], descFlagWrite)
		binary.LittleEndian.PutUint16(d[14:], 0)
		binary.LittleEndian.PutUint16(avail.Bytes[4+2*i:], uint16(i))
	}
	atomic.StoreUint32((*uint32)(avail.Ptr()), uint32(qsize)<<16)
	nreg, err := w.Reg16(uintptr(notify.Offset) + uintptr(notifyOff)*uintptr(notify.NotifyOffMultiplier))
	require.NoError(t, err)
	doorbell.Wmb()
	nreg.Write(0) // queue index 0

	// Sleep on the eventfd until the device interrupts.
	n, err := efs[0].Wait(context.Background(), time.Now().Add(60*time.Second))
	require.NoError(t, err, "MSI-X vector 0 fires when a frame lands")
	usedIdx := uint16(atomic.LoadUint32((*uint32)(used.Ptr())) >> 16)
	require.NotZero(t, usedIdx, "the device used a buffer")
	id := binary.LittleEndian.Uint32(used.Bytes[4:])
	length := binary.LittleEndian.Uint32(used.Bytes[8:])
	require.Less(t, id, uint32(qsize), "used id is one we posted")
	require.LessOrEqual(t, length, uint32(pool.BufSize()), "used length fits the buffer")
	require.Greater(t, length, uint32(virtioNetHdrLen+14))
	frame := pool.Buf(id)[virtioNetHdrLen:length]
	require.True(t, bytes.Contains(frame, []byte(FramePrefix)), "frame carries the host's payload: % x", frame[:min(len(frame), 64)])
	t.Logf("virtio: %d interrupt(s), used idx %d, frame of %d bytes in buffer %d at IOVA %#x",
		n, usedIdx, len(frame), id, pool.Addr(id))

	reg8(vcStatus, 0) // stop the device before its memory goes away
	require.NoError(t, o.d.DisableMSIX())
	require.NoError(t, space.Close())
	require.NoError(t, o.c.Close())
	for _, e := range efs {
		require.NoError(t, e.Close())
	}
	require.Equal(t, before, snapshot(t), "Close returns fds and mappings")
}
