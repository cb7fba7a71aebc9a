package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/igb"
)

// infoOutput is 'vfnic info -json': what testpmd's "show port info",
// ibv_devinfo -v and fi_info -v tell, for one NIC, read without sending
// or receiving anything.
type infoOutput struct {
	Address string `json:"address"`
	Driver  string `json:"driver"`
	Model   string `json:"model"`
	MAC     string `json:"mac"`
	MTU     int    `json:"mtu"`
	// MaxRxFrame and MaxTxFrame are the longest frames queue 0 receives
	// into one buffer and sends (MTU+22 for a tagged full-size frame).
	MaxRxFrame int      `json:"max_rx_frame"`
	MaxTxFrame int      `json:"max_tx_frame"`
	Link       infoLink `json:"link"`
	// QueuePairs is what this open used (the driver's default, one),
	// MaxQueuePairs what the device offers (nic.Config.QueuePairs).
	QueuePairs    int      `json:"queue_pairs"`
	MaxQueuePairs int      `json:"max_queue_pairs"`
	QueueSize     int      `json:"queue_size"`
	RxBuffers     int      `json:"rx_buffers"`
	BufferSize    int      `json:"buffer_size"`
	Vectors       int      `json:"msix_vectors"`
	Features      []string `json:"features"`
	// Offloads are what the driver can have the device do per frame.
	Offloads []string `json:"offloads"`
	// Rebound and PreviousDriver: info bound the NIC to vfio-pci for the
	// look and gave it back to PreviousDriver.
	Rebound        bool   `json:"rebound"`
	PreviousDriver string `json:"previous_driver"`
	// Counters are the driver's since this open: what info itself cost.
	Counters nic.Stats `json:"counters"`
	// Hardware are the device's statistics registers since this open
	// (igb's; cleared at open, as the driver resets the device);
	// HardwareNote says why there are none (virtio).
	Hardware     *igb.HWStats `json:"hardware_counters,omitempty"`
	HardwareNote string       `json:"hardware_note,omitempty"`
}

type infoLink struct {
	Up         bool `json:"up"`
	Reported   bool `json:"reported"` // false: the device does not report its link
	SpeedMbps  int  `json:"speed_mbps"`
	FullDuplex bool `json:"full_duplex"`
	// Error is why the link could not be read ("" when it was).
	Error string `json:"error,omitempty"`
}

// runInfo opens one NIC, reads what it is and what was negotiated, and
// closes it: no frame is sent and no receive buffer is posted.
func runInfo(ctx context.Context, args []string, o stdio) error {
	fs := newFlags("info", "[-json] [-force] DEVICE")
	asJSON := fs.Bool("json", false, "print one JSON object")
	force := fs.Bool("force", false, "take the NIC even if its kernel interface is up or has addresses (it goes back on exit)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("%w: name one PCI address or host interface (afxdp:IF, afpacket:IF; see 'vfnic list')", errUsage)
	}
	dn, err := parseDevice(fs.Arg(0))
	if err != nil {
		return err
	}
	var kernel kernelState
	defer kernel.giveBack(o.err) // after the device
	// A host interface stays the kernel's: nothing to take.
	if *force && dn.pci {
		kernel.take(dn.addr, o.err)
	}
	dev, err := openNIC(ctx, fs.Arg(0), nic.Config{Force: *force})
	if err != nil {
		return err
	}
	defer dev.Close()
	in := dev.Info()
	out := infoOutput{Address: in.Address, Driver: in.Driver, Model: in.Model, MAC: in.MAC.String(), MTU: in.MTU,
		QueuePairs: in.QueuePairs, MaxQueuePairs: in.MaxQueuePairs, QueueSize: in.QueueSize, RxBuffers: in.RxBuffers,
		BufferSize: in.BufferSize, Vectors: in.Vectors, Features: in.Features, Offloads: offloads(dev),
		Rebound: in.Rebound, PreviousDriver: in.PreviousDriver}
	if out.Features == nil {
		out.Features = []string{}
	}
	if rx, err := dev.Rx(0); err == nil {
		out.MaxRxFrame = rx.MaxFrame()
	}
	if tx, err := dev.Tx(0); err == nil {
		out.MaxTxFrame = tx.MaxFrame()
	}
	if l, err := dev.Link(); err != nil {
		out.Link.Error = err.Error()
	} else {
		out.Link = infoLink{Up: l.Up, Reported: l.Reported, SpeedMbps: l.SpeedMbps, FullDuplex: l.FullDuplex}
	}
	out.Counters = dev.Stats()
	out.Hardware, out.HardwareNote = hardwareCounters(dev)
	if *asJSON {
		enc := json.NewEncoder(o.out)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	printInfo(o.out, out)
	return nil
}

func printInfo(w io.Writer, in infoOutput) {
	line := func(k, f string, a ...any) { fmt.Fprintf(w, "  %-16s %s\n", k, fmt.Sprintf(f, a...)) }
	fmt.Fprintf(w, "%s: %s (%s driver)\n", in.Address, in.Model, in.Driver)
	line("MAC", "%s", in.MAC)
	line("MTU", "%d (frames up to %d bytes sent, %d received into one buffer)", in.MTU, in.MaxTxFrame, in.MaxRxFrame)
	line("link", "%s", linkText(in.Link))
	line("queue pairs", "%d used, %d offered", in.QueuePairs, in.MaxQueuePairs)
	line("rings", "%d descriptors; %d receive buffers of %d bytes", in.QueueSize, in.RxBuffers, in.BufferSize)
	line("MSI-X vectors", "%d", in.Vectors)
	line("features", "%s", listText(in.Features))
	line("offloads", "%s", listText(in.Offloads))
	line("hw counters", "%s", hardwareText(in.Hardware, in.HardwareNote))
	if in.Driver == "afxdp" || in.Driver == "afpacket" {
		line("binding", "host interface: the kernel keeps it (frames vfnic does not take go to its stack)")
	} else if dn, err := parseDevice(in.Address); err == nil && !dn.pci {
		line("binding", "none: not a PCI function")
	} else if in.Rebound {
		line("binding", "bound to vfio-pci for this look (was %s), given back on exit", driverName(in.PreviousDriver))
	} else {
		line("binding", "vfio-pci")
	}
}

func linkText(l infoLink) string {
	switch {
	case l.Error != "":
		return "unknown: " + l.Error
	case !l.Reported:
		return "up (the device does not report its link)"
	case !l.Up:
		return "down"
	}
	s := "up"
	if l.SpeedMbps > 0 {
		s += fmt.Sprintf(", %d Mbit/s", l.SpeedMbps)
		if l.FullDuplex {
			s += " full duplex"
		} else {
			s += " half duplex"
		}
	}
	return s
}

func listText(ss []string) string {
	if len(ss) == 0 {
		return "none"
	}
	return strings.Join(ss, " ")
}

// offloads names what the driver can have the device do per frame, from
// the negotiated features (virtio's) and the queues' optional methods
// (igb's receive write-back and transmit checksum contexts).
func offloads(dev nic.Device) []string {
	var o []string
	feats := map[string]bool{}
	for _, f := range dev.Info().Features {
		feats[f] = true
	}
	for _, f := range []struct{ feature, what string }{
		{"CSUM", "tx checksum"}, {"GUEST_CSUM", "rx checksum"}, {"HOST_TSO4", "tx TSO IPv4"}, {"HOST_TSO6", "tx TSO IPv6"},
		{"GUEST_TSO4", "rx LRO IPv4"}, {"GUEST_TSO6", "rx LRO IPv6"}, {"HOST_USO", "tx USO"}, {"MRG_RXBUF", "rx merged buffers"},
		{"CTRL_VLAN", "vlan filter"}, {"RSS", "rss"}, {"HASH_REPORT", "rx hash report"},
		{"rss", "rss"},
	} {
		if feats[f.feature] && !slices.Contains(o, f.what) {
			o = append(o, f.what)
		}
	}
	if rx, err := dev.Rx(0); err == nil {
		if _, ok := rx.(interface {
			Offload(uintptr) (igb.RxOffload, error)
		}); ok {
			o = append(o, "rx checksum, packet type, rss hash and vlan tag reported per frame")
		}
	}
	if tx, err := dev.Tx(0); err == nil {
		if _, ok := tx.(interface {
			SendChecksum([]byte, any, igb.TxChecksum) error
		}); ok {
			o = append(o, "tx IPv4/TCP/UDP checksum")
		}
	}
	if o == nil {
		o = []string{}
	}
	return o
}
