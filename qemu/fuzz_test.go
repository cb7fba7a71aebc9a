package qemu

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzParseNICs: a NIC list ParseNICs accepts is one ResolveNICs accepts
// (so a boot does), and FormatNICs writes it back as a list that parses
// to the same NICs, before and after resolving; a refused list is
// ErrBadConfig. Nothing panics.
func FuzzParseNICs(f *testing.F) {
	for _, s := range []string{
		"virtio,packed=on,net=hub:0 e1000e,net=dgram:4000:4001;igb,ip=10.1.0.2/16,slot=0x10,mac=02:00:00:00:00:09",
		"virtio,event_idx=off,mrg_rxbuf=off,rx_queue_size=1024,host_mtu=9000,net=hub:1 e1000e,ats=off",
		"igb,bind=none,net=none;vmxnet3,bind=linux", "virtio-net-pci,slot=5 virtio,slot=6,packed=off",
		",net=", "e1000e,packed=on", "igb,slot=4 e1000e,slot=4", "virtio,iommu_platform=off", "  ",
		"igb,net=hub:-1", "igb,slot=-0x1", "e1000e,x=1,x=2", "net=hub:0",
		"virtio,net=tap:w0 virtio,bind=linux,ip=10.0.0.2/24,net=tap:w0", "igb,net=tap:", "igb,net=tap:a:b",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		nics, err := ParseNICs(spec)
		if err != nil {
			require.ErrorIs(t, err, ErrBadConfig)
			require.Nil(t, nics)
			return
		}
		resolved, err := ResolveNICs(nics)
		require.NoError(t, err, "ParseNICs accepted %q", spec)
		for _, l := range [][]NIC{nics, resolved} {
			text := FormatNICs(l)
			back, err := ParseNICs(text)
			require.NoError(t, err, "%q formatted as %q", spec, text)
			if len(l) == 0 {
				require.Empty(t, back)
				continue
			}
			require.Equal(t, l, back, "%q formatted as %q", spec, text)
		}
		for i, n := range resolved {
			// Every resolved NIC makes QEMU arguments.
			args := n.qemuArgs(i)
			require.NotEmpty(t, args)
		}
	})
}

// FuzzConsole feeds arbitrary serial output to the console splitter in
// pieces whose sizes the input picks, and checks that the result does
// not depend on how the stream was cut: the same console, payload
// output, kernel log, markers and exit status as when written at once,
// carriage returns dropped, the live copies equal to what was kept.
//
// Input: byte 0 picks the piece sizes (1 to 16), the rest is the stream;
// the nonce is "n1".
func FuzzConsole(f *testing.F) {
	f.Add([]byte("\x07[    1.0] noise\r\nVFNIC-KERNEL: 6.1.0-56-amd64\r\n" +
		"VFNIC-VFIO: 0000:00:04.0 group 1\r\nVFNIC-NET: 0000:00:05.0 eth0\r\n" +
		"VFNIC-BEGIN n1\r\nline one\r\nVFNIC-END other\r\nlast without newlineVFNIC-END n1\r\n" +
		"VFNIC-EXIT: 3\r\nVFNIC-COLLECT: ok\r\nVFNIC-MISSING: /out/x\r\nVFNIC-KLOG n1\r\n[ 2.0] DMAR: fault\r\n" +
		"VFNIC-KLOG-END n1\r\n[    3.0] reboot: Power down"))
	f.Add([]byte("\x00VFNIC-KERNEL: v\nVFNIC-ERROR: insmod vfio\n"))
	f.Add([]byte("\x03VFNIC-BEGIN n1\nVFNIC-END n1VFNIC-EXIT: x\nVFNIC-EXIT: -99999999999999999999\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 1 {
			return
		}
		piece, stream := 1+int(data[0])%16, data[1:]
		var live, liveOut bytes.Buffer
		whole := newConsole("n1", nil, nil)
		cut := newConsole("n1", &live, &liveOut)
		n, err := whole.Write(stream)
		require.NoError(t, err)
		require.Equal(t, len(stream), n)
		for i := 0; i < len(stream); i += piece {
			p := stream[i:min(i+piece, len(stream))]
			n, err := cut.Write(p)
			require.NoError(t, err)
			require.Equal(t, len(p), n)
		}
		whole.flush()
		cut.flush()
		clean := bytes.ReplaceAll(stream, []byte{'\r'}, nil)
		require.Equal(t, string(clean), whole.all.String())
		require.Equal(t, whole.all.String(), cut.all.String())
		require.Equal(t, cut.all.String(), live.String())
		require.Equal(t, whole.out.String(), cut.out.String())
		require.Equal(t, cut.out.String(), liveOut.String())
		require.Equal(t, whole.klog.String(), cut.klog.String())
		require.Equal(t, whole.phase, cut.phase)
		require.Equal(t, whole.kernelVersion, cut.kernelVersion)
		require.Equal(t, whole.setupErr, cut.setupErr)
		require.Equal(t, whole.exitCode, cut.exitCode)
		require.Equal(t, whole.haveExit, cut.haveExit)
		require.Equal(t, whole.info, cut.info)
		require.Equal(t, whole.collect, cut.collect)
		require.Equal(t, whole.missing, cut.missing)
		if !whole.haveExit {
			require.Equal(t, -1, whole.exitCode)
		}
		if whole.phase < phasePayload {
			require.Empty(t, whole.out.String(), "no payload output before its marker")
		}
		_ = whole.tail(3)
	})
}
