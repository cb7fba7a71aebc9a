package igb

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/nic"
)

// TestBringUpRegisters checks what the bring-up leaves in the registers
// against the values the 82576 datasheet and Linux igb give.
func TestBringUpRegisters(t *testing.T) {
	d, f := newFakeDevice(t, Config{Config: nic.Config{QueuePairs: 2, QueueSize: 256}, Moderation: 50 * time.Microsecond})
	require.Equal(t, net.HardwareAddr(testMAC[:]), d.MAC())
	require.Equal(t, 1, f.writes[regCTRL]-1, "one reset (and one SLU write)")
	require.NotZero(t, f.get(regCTRL)&ctrlSLU)
	require.NotZero(t, f.get(regCTRLEXT)&ctrlExtDrvLoad)
	require.Equal(t, uint16(phyAutoNegEn|phyRestartAutoN), f.phy[phyCtrl], "auto-negotiation restarted")
	require.Equal(t, uint32(0xC0000011), f.get(regGPIE), "NSICR|MSIX_MODE|EIAME|PBA")
	// 82576 IVAR: row q&7, RX byte at 16*(q>>3), TX 8 bits above; vector|0x80.
	require.Equal(t, uint32(0x8281), f.get(regIVAR0), "queue 0: rx vector 1, tx vector 2")
	require.Equal(t, uint32(0x8483), f.get(regIVAR0+4), "queue 1: rx vector 3, tx vector 4")
	require.Equal(t, uint32(0x8000), f.get(regIVARMISC), "other causes on vector 0")
	require.Equal(t, uint32(0x1f), f.get(regEIAC), "queue vectors 1-4 and the other-causes vector 0 auto-clear")
	require.Equal(t, uint32(0x1e), f.get(regEIAM), "queue vectors auto-mask, vector 0 not")
	require.Equal(t, uint32(1), f.get(regEIMS), "only vector 0 unmasked until a reader arms")
	require.Equal(t, uint32(icrLSC), f.get(regIMS))
	require.Equal(t, uint32(200|eitrCntIgnr), f.get(regEITR0+4), "50us")
	for i := 0; i < 2; i++ {
		require.Equal(t, uint32(256*16), f.get(rxReg(regRDLEN0, i)))
		require.Equal(t, uint32(2|srrctlDescAdvOne|srrctlDropEn), f.get(rxReg(regSRRCTL0, i)), "2 KiB buffers, advanced one-buffer")
		require.NotZero(t, f.get(rxReg(regRXDCTL0, i))&dctlEnable)
		require.NotZero(t, f.get(txReg(regTXDCTL0, i))&dctlEnable)
		require.Equal(t, uint32(256*16), f.get(txReg(regTDLEN0, i)))
		rq := d.rx[i]
		require.Equal(t, uint32(uintptr(rq.ringAddr())), f.get(rxReg(regRDBAL0, i)))
	}
	require.Equal(t, uint32(rctlEN|rctlBAM|rctlSECRC|rctlMPE|rctlLPE), f.get(regRCTL))
	require.Equal(t, uint32(1500+14+4+2*4), f.get(regRLPML), "a double-tagged full-size frame and its FCS, as Linux igb")
	require.Equal(t, uint32(tctlEN|tctlPSP|tctlRTLC|15<<4|63<<12), f.get(regTCTL))
	require.Equal(t, uint32(mrqcRSS|mrqcIPv4|mrqcIPv4TCP|mrqcIPv4UDP|mrqcIPv6|mrqcIPv6TCP|mrqcIPv6UDP), f.get(regMRQC))
	require.Equal(t, uint32(0x01000100), f.get(regRETA0), "RETA alternates queues 0 and 1")
	require.NotZero(t, f.get(regRXCSUM)&rxcsumPCSD, "RSS needs PCSD")
	require.Equal(t, uint32(0xda565a6d), f.get(regRSSRK0))
	l, err := d.Link()
	require.NoError(t, err)
	require.Equal(t, nic.Link{Up: true, Reported: true, SpeedMbps: 1000, FullDuplex: true}, l)
	require.Equal(t, "igb", d.Info().Driver)
}

// TestLinkReadsICR: Link clears the interrupt causes (ICR) whether or not
// the driver took the link interrupt itself: a program that sleeps on
// LinkInterrupt takes it, and the device signals no further change until
// ICR is read.
func TestLinkReadsICR(t *testing.T) {
	d, f := newFakeDevice(t, Config{})
	efd := d.LinkInterrupt()
	require.NoError(t, efd.Add(1)) // an interrupt...
	n, err := efd.Take()           // ...taken by the program
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	before := f.reads[regICR]
	_, err = d.Link()
	require.NoError(t, err)
	require.Equal(t, before+1, f.reads[regICR], "Link read ICR")
	require.NoError(t, efd.Add(1))
	st := d.Stats()
	require.Equal(t, before+2, f.reads[regICR], "so did Stats")
	require.EqualValues(t, 1, st.ConfigInterrupts, "the interrupt the driver took")
}

// TestTxFrameSizes: a transmit queue takes MTU + nic.FrameOverhead bytes
// (1518- and 1522-byte tagged full-size frames) and refuses one more.
func TestTxFrameSizes(t *testing.T) {
	d, f := newFakeDevice(t, Config{Config: nic.Config{QueueSize: 16}})
	dev := newFakeNIC(t, d, f)
	tx := d.tx[0]
	require.Equal(t, d.Info().MTU+nic.FrameOverhead, tx.MaxFrame())
	for _, size := range []int{1514, 1518, 1522} {
		require.NoError(t, tx.Send(frameOf(size, size), size), "%d bytes", size)
	}
	require.ErrorIs(t, tx.Send(frameOf(0, 1523), nil), nic.ErrFrameSize)
	require.NoError(t, tx.Flush())
	sent := dev.transmit()
	require.Len(t, sent, 3)
	for i, size := range []int{1514, 1518, 1522} {
		require.Equal(t, frameOf(size, size), sent[i], "%d bytes intact", size)
	}
	out := make([]nic.Completion, 4)
	require.Equal(t, 3, tx.Poll(out))
	require.Equal(t, 1522, out[2].Len)
}

func TestIVARLayouts(t *testing.T) {
	for _, c := range []struct {
		l     ivarLayout
		q     int
		tx    bool
		reg   int
		shift uint
		desc  string
	}{
		{ivar82576, 0, false, 0, 0, "82576 q0 rx"},
		{ivar82576, 0, true, 0, 8, "82576 q0 tx"},
		{ivar82576, 9, false, 1, 16, "82576 q9 rx"},
		{ivar82576, 15, true, 7, 24, "82576 q15 tx"},
		{ivar82580, 1, false, 0, 16, "i350 q1 rx"},
		{ivar82580, 5, true, 2, 24, "i350 q5 tx"},
	} {
		reg, shift := c.l.ivarSlot(c.q, c.tx)
		require.Equal(t, c.reg, reg, c.desc)
		require.Equal(t, c.shift, shift, c.desc)
	}
}

func TestBringUpFailures(t *testing.T) {
	f := newFakeRegs(t)
	f.rstStuck = true
	_, err := startFake(f, Config{})
	require.ErrorIs(t, err, nic.ErrDeviceFailed)

	f = newFakeRegs(t)
	f.set(regRAH0, 0)
	_, err = startFake(f, Config{})
	require.ErrorIs(t, err, nic.ErrDeviceFailed)

	_, err = startFake(newFakeRegs(t), Config{Config: nic.Config{QueuePairs: 10}})
	require.ErrorIs(t, err, nic.ErrNotSupported, "10 vectors hold 9 pairs with interrupts")
	require.ErrorContains(t, err, "NoQueueInterrupts")
	_, err = startFake(newFakeRegs(t), Config{Config: nic.Config{QueuePairs: 17}, NoQueueInterrupts: true})
	require.ErrorIs(t, err, nic.ErrInvalid, "the 82576 has 16 queue pairs")
	_, err = startFake(newFakeRegs(t), Config{Config: nic.Config{BufferSize: 1024}})
	require.ErrorIs(t, err, nic.ErrInvalid)
}

func frameOf(i, size int) []byte {
	b := make([]byte, size)
	for j := range b {
		b[j] = byte(i + j)
	}
	return b
}

// TestRxTxManyLaps sends and receives mixed-size frames through a small
// ring for many laps, in order and intact.
func TestRxTxManyLaps(t *testing.T) {
	d, f := newFakeDevice(t, Config{Config: nic.Config{QueueSize: 16, RxBuffers: 32}})
	dev := newFakeNIC(t, d, f)
	rx, tx := d.rx[0], d.tx[0]
	require.Equal(t, 15, fill(t, rx), "one descriptor stays empty")
	out := make([]nic.Completion, 8)
	next := 0
	for i := 0; i < 500; i++ {
		size := 60 + (i*37)%1455
		dev.receive(frameOf(i, size))
		if i%5 != 4 {
			continue
		}
		for {
			n := rx.Poll(out)
			if n == 0 {
				break
			}
			for _, c := range out[:n] {
				require.NoError(t, c.Err)
				require.Equal(t, next, c.Context, "contexts in posting order")
				exp := frameOf(next, 60+(next*37)%1455)
				require.True(t, bytes.Equal(exp, c.Data), "frame %d", next)
				b, err := rx.Frame(c.Buf, c.Len)
				require.NoError(t, err)
				require.Equal(t, exp, b)
				next++
				require.NoError(t, rx.Repost(c.Buf, next+14))
			}
		}
		require.NoError(t, rx.Flush())
	}
	require.Equal(t, 500, next)
	require.EqualValues(t, 500, rx.Stats().Packets)

	sent := 0
	for i := 0; i < 300; i++ {
		require.NoError(t, tx.Send(frameOf(i, 14+i%1500), i))
		if i%7 == 6 {
			require.NoError(t, tx.Flush())
			got := dev.transmit()
			for _, g := range got {
				require.Equal(t, frameOf(sent, 14+sent%1500), g)
				sent++
			}
			n := tx.Poll(out)
			require.Equal(t, len(got), n)
			for j, c := range out[:n] {
				require.NoError(t, c.Err)
				require.Equal(t, len(got[j]), c.Len)
			}
		}
	}
	require.ErrorIs(t, tx.Send(make([]byte, 13), nil), nic.ErrFrameSize)
	require.ErrorIs(t, tx.Send(make([]byte, 1523), nil), nic.ErrFrameSize)
}

// TestTxFull: a full ring refuses with ErrFull until completions are read.
func TestTxFull(t *testing.T) {
	d, f := newFakeDevice(t, Config{Config: nic.Config{QueueSize: 8}})
	dev := newFakeNIC(t, d, f)
	tx := d.tx[0]
	for i := 0; i < 7; i++ {
		require.NoError(t, tx.Send(frameOf(i, 60), i))
	}
	require.ErrorIs(t, tx.Send(frameOf(7, 60), 7), nic.ErrFull)
	require.NoError(t, tx.Flush())
	require.Len(t, dev.transmit(), 7)
	out := make([]nic.Completion, 16)
	require.Equal(t, 7, tx.Poll(out))
	require.NoError(t, tx.Send(frameOf(7, 60), 7))
}

// TestArmMasks: Arm unmasks the queue's vector (EIMS), a poll that
// returns completions masks it again (EIMC).
func TestArmMasks(t *testing.T) {
	d, f := newFakeDevice(t, Config{})
	dev := newFakeNIC(t, d, f)
	rx := d.rx[0]
	fill(t, rx)
	require.NoError(t, rx.Arm(1))
	require.Equal(t, uint32(1<<1), f.get(regEIMS)&(1<<1), "rx vector 1 unmasked")
	dev.receive(frameOf(0, 64))
	out := make([]nic.Completion, 4)
	require.Equal(t, 1, rx.Poll(out))
	require.Equal(t, uint32(1<<1), f.get(regEIMC), "masked again")
	// SRead with nothing to read times out (the fake raises no interrupt).
	start := time.Now()
	_, err := rx.SRead(t.Context(), out, 1, 20*time.Millisecond)
	require.ErrorIs(t, err, nic.ErrTimeout)
	require.GreaterOrEqual(t, time.Since(start), 20*time.Millisecond)
}

// TestBindCQ reads a queue pair through a user CQ: successes with the
// frame address and length, and the device's error conditions as error
// completions in order.
func TestBindCQ(t *testing.T) {
	d, f := newFakeDevice(t, Config{Config: nic.Config{QueueSize: 16}})
	dev := newFakeNIC(t, d, f)
	c, err := cq.New(cq.Attr{Size: 64, Format: cq.FormatData, WaitObj: cq.WaitFD}, cq.Limits{})
	require.NoError(t, err)
	require.NoError(t, d.BindCQ(c, 0, nic.Recv|nic.Send))
	require.Error(t, d.BindCQ(c, 0, nic.Recv), "bound twice")
	rx := d.rx[0]
	fill(t, rx)
	dev.receive(frameOf(1, 100))
	dev.writeBack(dev.rdh, rxdStatusDD|rxdStatusEOP, 5000) // beyond the buffer
	dev.rdh++
	dev.receive(frameOf(3, 200))
	require.NoError(t, d.tx[0].Send(frameOf(9, 90), "tx"))
	require.NoError(t, d.tx[0].Flush())
	dev.transmit()

	ents := make([]cq.Entry, 8)
	n, err := c.Read(ents)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, 100, ents[0].Len)
	require.Equal(t, uint32(0), ents[0].Queue)
	b, err := rx.Frame(ents[0].Buf, ents[0].Len)
	require.NoError(t, err)
	require.Equal(t, frameOf(1, 100), b)
	_, err = c.Read(ents)
	require.ErrorIs(t, err, cq.ErrAvail)
	var ee cq.ErrEntry
	require.NoError(t, c.ReadErr(&ee))
	require.Equal(t, cq.ProvBadLen, ee.ProvErrno)
	require.Equal(t, 1, ee.Context)
	n, err = c.Read(ents)
	require.NoError(t, err)
	require.Equal(t, 2, n, "the next receive and the send")
	var sawTx bool
	for _, e := range ents[:n] {
		if e.Queue == 1 {
			sawTx = true
			require.Equal(t, "tx", e.Context)
			require.Equal(t, 90, e.Len)
			require.NotZero(t, e.Flags&cq.FlagSend)
		}
	}
	require.True(t, sawTx)
	out := make([]nic.Completion, 4)
	require.Equal(t, 1, rx.Poll(out), "a bound queue's own Poll says it is bound")
	require.ErrorIs(t, out[0].Err, nic.ErrBound)
	_, err = rx.SRead(context.Background(), out, 1, 0)
	require.ErrorIs(t, err, nic.ErrBound)
	require.NoError(t, d.Close())
	require.NoError(t, c.Close())
}

func TestMatch(t *testing.T) {
	for _, c := range []struct {
		vendor, device uint16
		ok             bool
	}{{0x8086, 0x10c9, true}, {0x8086, 0x1521, false}, {0x1af4, 0x10c9, false}, {0x8086, 0x10d3, false}} {
		m, _ := lookupMAC(c.device)
		got := c.vendor == intelVendorID && m != nil && m.tested
		require.Equal(t, c.ok, got, fmt.Sprintf("%04x:%04x", c.vendor, c.device))
	}
	require.True(t, errors.Is(errBadLen, cq.ProvBadLen))
}

// TestRingsTakeTheBatchLoop: the receive and transmit write-back rings
// take the ring reader's batch loop (NextBatch), not the generic read of
// each entry; a change to rxLayout or txLayout that this test catches
// needs cq/ring's batchPlan to take it.
func TestRingsTakeTheBatchLoop(t *testing.T) {
	d, _ := newFakeDevice(t, Config{Config: nic.Config{QueueSize: 16}})
	require.True(t, d.rx[0].r.src.Batched(), "receive")
	require.True(t, d.tx[0].r.src.Batched(), "transmit")
}
