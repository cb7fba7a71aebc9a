package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/vfnic/vfnic/dma"
	"github.com/vfnic/vfnic/doorbell"
	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/hugepage"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/virtio"
	"github.com/vfnic/vfnic/pci"
	"github.com/vfnic/vfnic/vfio"
)

// iovaFloor keeps probe's DMA memory above 4 GiB, clear of guest RAM
// addresses, so a device using a physical address by mistake faults.
const iovaFloor = 4 << 30

// probeReport is what probe found on one device, printed as it is found
// and, with -json, as one JSON object per device.
type probeReport struct {
	Address    string        `json:"address"`
	VendorID   string        `json:"vendor_id"`
	DeviceID   string        `json:"device_id"`
	Name       string        `json:"name"`
	IOMMUGroup int           `json:"iommu_group"`
	Driver     string        `json:"driver"`
	BARs       []probeBAR    `json:"bars,omitempty"`
	Virtio     *probeVirtioR `json:"virtio,omitempty"`
	IOVARanges []probeRange  `json:"iova_ranges,omitempty"`
	DMA        *probeDMA     `json:"dma,omitempty"`
	MSIX       *probeMSIX    `json:"msix,omitempty"`
	Host       *probeHostR   `json:"host,omitempty"`
	Error      string        `json:"error,omitempty"`
}

// probeHostR is what probe reports of a host interface (afxdp:IF).
type probeHostR struct {
	MAC        string   `json:"mac"`
	QueuePairs int      `json:"queue_pairs"`
	QueueSize  int      `json:"queue_size"`
	Features   []string `json:"features"`
}

type probeBAR struct {
	Index    int    `json:"index"`
	Size     uint64 `json:"size"`
	Mappable bool   `json:"mappable"`
	Areas    int    `json:"mmap_areas"`
}

type probeVirtioR struct {
	Features       string `json:"device_features"`
	Version1       bool   `json:"version_1"`
	AccessPlatform bool   `json:"access_platform"`
	RingPacked     bool   `json:"ring_packed"`
}

type probeRange struct {
	Start uint64 `json:"start"`
	End   uint64 `json:"end"`
}

type probeDMA struct {
	Bytes    int    `json:"bytes"`
	PageSize string `json:"page_size"`
	IOVA     uint64 `json:"iova"`
}

type probeMSIX struct {
	Vectors    int `json:"vectors"`
	Interrupts int `json:"interrupts"`
}

func runProbe(ctx context.Context, args []string, o stdio) error {
	fs := newFlags("probe", "[-all] [-json] [DEVICE...]")
	all := fs.Bool("all", false, "probe every NIC bound to vfio-pci")
	asJSON := fs.Bool("json", false, "print one JSON object per device on stdout (human lines go to stderr)")
	if err := parse(fs, args); err != nil {
		return err
	}
	var addrs []pci.Address
	var hosts []string // host interfaces (afxdp:IF), probed after the PCI functions
	if *all {
		devs, err := pci.List(pci.ListOptions{NetworkOnly: true, Driver: "vfio-pci"})
		if err != nil && !errors.Is(err, pci.ErrUnreadable) {
			return err
		}
		if err != nil {
			// Probe what could be read; name the rest.
			fmt.Fprintf(o.err, "vfnic: probe: %v\n", err)
		}
		for _, d := range devs {
			addrs = append(addrs, d.Address)
		}
		if len(addrs) == 0 {
			return errors.New("no NIC is bound to vfio-pci (see 'vfnic list' and 'vfnic bind')")
		}
	} else {
		ds, err := parseDevices(fs.Args())
		if err != nil {
			return err
		}
		for _, d := range ds {
			if !d.pci {
				hosts = append(hosts, d.arg)
				continue
			}
			addrs = append(addrs, d.addr)
		}
	}
	out := o.out
	if *asJSON {
		out = o.err
	}
	for _, a := range addrs {
		r := probeReport{Address: a.String(), IOMMUGroup: -1}
		err := probe(ctx, a, out, &r)
		if err != nil {
			r.Error = err.Error()
		}
		if *asJSON {
			if jerr := json.NewEncoder(o.out).Encode(r); jerr != nil {
				return jerr
			}
		}
		if err != nil {
			return fmt.Errorf("%s: %w", a, err)
		}
	}
	for _, h := range hosts {
		r := probeReport{Address: h, IOMMUGroup: -1}
		err := probeHost(ctx, h, out, &r)
		if err != nil {
			r.Error = err.Error()
		}
		if *asJSON {
			if jerr := json.NewEncoder(o.out).Encode(r); jerr != nil {
				return jerr
			}
		}
		if err != nil {
			return fmt.Errorf("%s: %w", h, err)
		}
	}
	return nil
}

// probeHost opens a host interface through its driver (no BARs, IOMMU or
// DMA memory there), reports what it negotiated and closes it.
func probeHost(ctx context.Context, name string, out io.Writer, rep *probeReport) error {
	dev, err := openNIC(ctx, name, nic.Config{})
	if err != nil {
		return err
	}
	in := dev.Info()
	rep.Name, rep.Driver = in.Model, in.Driver
	rep.Host = &probeHostR{MAC: in.MAC.String(), QueuePairs: in.QueuePairs, QueueSize: in.QueueSize, Features: in.Features}
	if rep.Host.Features == nil {
		rep.Host.Features = []string{}
	}
	fmt.Fprintf(out, "%s %s (%s driver), MAC %s, %d queue pair(s) of %d descriptors, features: %s\n",
		name, in.Model, in.Driver, in.MAC, in.QueuePairs, in.QueueSize, listText(in.Features))
	return dev.Close()
}

// probe opens one device through VFIO and exercises what every driver
// needs: BARs, the IOMMU's ranges, hugepage DMA memory, MSI-X eventfds.
func probe(ctx context.Context, a pci.Address, out io.Writer, rep *probeReport) error {
	d, err := pci.Lookup(a)
	if err != nil {
		return err
	}
	rep.VendorID, rep.DeviceID = fmt.Sprintf("%04x", d.VendorID), fmt.Sprintf("%04x", d.DeviceID)
	rep.Name, rep.IOMMUGroup, rep.Driver = nicName(d), d.IOMMUGroup, d.Driver
	fmt.Fprintf(out, "%s %04x:%04x %s, IOMMU group %d, driver %s\n", a, d.VendorID, d.DeviceID, nicName(d), d.IOMMUGroup, d.Driver)
	if d.Driver != "vfio-pci" {
		if reasons, _ := (pci.Sysfs{}).InUse(a, nil); len(reasons) > 0 {
			return fmt.Errorf("not bound to vfio-pci, and the kernel uses it: %s (run 'vfnic bind -force %s' to take it anyway)",
				strings.Join(reasons, ", "), a)
		}
		return fmt.Errorf("not bound to vfio-pci (run 'vfnic bind %s')", a)
	}
	c, err := vfio.OpenContainer()
	if err != nil {
		return err
	}
	defer c.Close()
	g, err := c.OpenGroup(d.IOMMUGroup)
	if err != nil {
		return heldBy(a, err)
	}
	dev, err := g.OpenDevice(a.String())
	if err != nil {
		return heldBy(a, err)
	}
	if err := dev.SetBusMaster(true); err != nil {
		return err
	}
	for i := vfio.RegionBAR0; i <= vfio.RegionBAR5; i++ {
		ri, err := dev.RegionInfo(i)
		if err != nil || ri.Size == 0 {
			continue
		}
		how := "not mappable"
		b := probeBAR{Index: i, Size: ri.Size}
		if m, err := dev.MapRegion(i); err == nil {
			b.Mappable, b.Areas = true, len(m.Areas())
			how = fmt.Sprintf("mapped, %d areas", b.Areas)
			_ = m.Close()
		}
		rep.BARs = append(rep.BARs, b)
		fmt.Fprintf(out, "  BAR%d: %s, %s\n", i, size(ri.Size), how)
	}
	if d.VendorID == pci.VirtioVendorID {
		if err := probeVirtio(dev, out, rep); err != nil {
			return err
		}
	}

	space, err := dma.NewVFIOSpace(c, iovaFloor)
	if err != nil {
		return err
	}
	defer space.Close()
	fmt.Fprintf(out, "  IOMMU IOVA ranges: %v\n", space.Ranges())
	for _, rg := range space.Ranges() {
		rep.IOVARanges = append(rep.IOVARanges, probeRange{Start: rg.Start, End: rg.End})
	}
	r, err := space.Alloc(2<<20, hugepage.Options{})
	if err != nil {
		return err
	}
	rep.DMA = &probeDMA{Bytes: r.Len(), PageSize: r.PageSize().String(), IOVA: r.IOVA()}
	fmt.Fprintf(out, "  DMA: %d KiB in %s pages mapped at IOVA %#x\n", r.Len()>>10, r.PageSize(), r.IOVA())

	info, err := dev.IRQInfo(vfio.IRQMSIX)
	if err != nil {
		return err
	}
	efs := make([]*eventfd.FD, info.Count)
	fds := make([]int, info.Count)
	for i := range efs {
		if efs[i], err = eventfd.New(); err != nil {
			return err
		}
		defer efs[i].Close()
		fds[i] = efs[i].Fd()
	}
	if err := dev.EnableMSIX(fds); err != nil {
		return err
	}
	// Raise each vector through VFIO and sleep on its eventfd: the path an
	// interrupt takes from the kernel to a parked goroutine.
	got := 0
	for i := range efs {
		if err := dev.TriggerIRQ(vfio.IRQMSIX, i); err != nil {
			return err
		}
		n, err := efs[i].Wait(ctx, time.Now().Add(2*time.Second))
		if err != nil {
			return fmt.Errorf("MSI-X vector %d: %w", i, err)
		}
		got += int(n)
	}
	rep.MSIX = &probeMSIX{Vectors: info.Count, Interrupts: got}
	fmt.Fprintf(out, "  MSI-X: %d vectors wired to eventfds in one SET_IRQS, %d interrupts received\n", info.Count, got)
	if err := dev.DisableMSIX(); err != nil {
		return err
	}
	return nil
}

func probeVirtio(dev *vfio.Device, out io.Writer, rep *probeReport) error {
	cfg, err := pci.ReadConfig(dev.ConfigReader())
	if err != nil {
		return err
	}
	caps, err := cfg.VirtioCaps()
	if err != nil {
		return err
	}
	vc, ok := pci.VirtioStructures(caps)[pci.VirtioCommonCfg]
	if !ok {
		return errors.New("virtio common configuration capability missing")
	}
	m, err := dev.MapRegion(int(vc.Bar))
	if err != nil {
		return err
	}
	defer m.Close()
	w := doorbell.NewWindow(m.Bytes())
	var feat virtio.Features
	for sel := uint32(0); sel < 2; sel++ {
		if err := w.Write32(uintptr(vc.Offset), sel); err != nil { // device_feature_select
			return fmt.Errorf("virtio common config: %w", err)
		}
		v, err := w.Read32(uintptr(vc.Offset) + 4) // device_feature
		if err != nil {
			return fmt.Errorf("virtio common config: %w", err)
		}
		feat |= virtio.Features(v) << (32 * sel)
	}
	rep.Virtio = &probeVirtioR{Features: fmt.Sprintf("%#x", uint64(feat)), Version1: feat.Has(virtio.FeatureVersion1),
		AccessPlatform: feat.Has(virtio.FeatureAccessPlat), RingPacked: feat.Has(virtio.FeatureRingPacked)}
	fmt.Fprintf(out, "  virtio: device features %#x (VERSION_1 %v, ACCESS_PLATFORM %v, RING_PACKED %v)\n", uint64(feat),
		feat.Has(virtio.FeatureVersion1), feat.Has(virtio.FeatureAccessPlat), feat.Has(virtio.FeatureRingPacked))
	return nil
}

func size(n uint64) string {
	if n < 1024 {
		return fmt.Sprintf("%d bytes", n)
	}
	return fmt.Sprintf("%d KiB", n>>10)
}
