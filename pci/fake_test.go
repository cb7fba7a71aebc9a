package pci

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
)

// fakeSys builds a sysfs tree in a temporary directory with the same shape
// as the kernel's: real device directories under devices/, symlinks to them
// from bus/pci/devices, and relative driver, iommu_group and class/net links.
type fakeSys struct {
	t    *testing.T
	root string
}

// fakeDev describes one device of a fake tree.
type fakeDev struct {
	addr           string
	vendor, device uint16
	subVendor      uint16
	subDevice      uint16
	class          uint32
	rev            uint8
	group          int    // -1: no iommu_group link
	driver         string // "": unbound
	override       string // "": "(null)"
	numa           string // "": no numa_node file
	nets           []string
	virtioNet      bool // put nets under virtio0/net like virtio-net does
	config         []byte
	resource       string
}

func newFakeSys(t *testing.T) *fakeSys {
	t.Helper()
	f := &fakeSys{t: t, root: t.TempDir()}
	for _, d := range []string{"bus/pci/devices", "bus/pci/drivers", "devices/pci0000:00", "kernel/iommu_groups", "class/net"} {
		f.mkdir(d)
	}
	f.write("bus/pci/drivers_probe", "")
	return f
}

func (f *fakeSys) sys() Sysfs { return Sysfs{Root: f.root} }

func (f *fakeSys) path(rel string) string { return filepath.Join(f.root, rel) }

func (f *fakeSys) mkdir(rel string) {
	f.t.Helper()
	if err := os.MkdirAll(f.path(rel), 0o755); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fakeSys) write(rel, content string) {
	f.t.Helper()
	if err := os.WriteFile(f.path(rel), []byte(content), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fakeSys) read(rel string) string {
	f.t.Helper()
	b, err := os.ReadFile(f.path(rel))
	if err != nil {
		f.t.Fatal(err)
	}
	return string(b)
}

func (f *fakeSys) symlink(target, rel string) {
	f.t.Helper()
	if err := os.Symlink(target, f.path(rel)); err != nil {
		f.t.Fatal(err)
	}
}

// addDriver makes a loaded driver: bus/pci/drivers/<name> with its bind and
// unbind attributes.
func (f *fakeSys) addDriver(name string) {
	dir := "bus/pci/drivers/" + name
	f.mkdir(dir)
	f.write(dir+"/bind", "")
	f.write(dir+"/unbind", "")
}

func (f *fakeSys) devRel(addr string) string { return "devices/pci0000:00/" + addr }

func (f *fakeSys) addDevice(d fakeDev) {
	f.t.Helper()
	dir := f.devRel(d.addr)
	f.mkdir(dir)
	f.symlink("../../../"+dir, "bus/pci/devices/"+d.addr)
	f.write(dir+"/vendor", fmt.Sprintf("0x%04x\n", d.vendor))
	f.write(dir+"/device", fmt.Sprintf("0x%04x\n", d.device))
	f.write(dir+"/subsystem_vendor", fmt.Sprintf("0x%04x\n", d.subVendor))
	f.write(dir+"/subsystem_device", fmt.Sprintf("0x%04x\n", d.subDevice))
	f.write(dir+"/class", fmt.Sprintf("0x%06x\n", d.class))
	f.write(dir+"/revision", fmt.Sprintf("0x%02x\n", d.rev))
	ov := d.override
	if ov == "" {
		ov = "(null)"
	}
	f.write(dir+"/driver_override", ov+"\n")
	if d.numa != "" {
		f.write(dir+"/numa_node", d.numa+"\n")
	}
	if d.group >= 0 {
		g := fmt.Sprintf("kernel/iommu_groups/%d", d.group)
		f.mkdir(g + "/devices")
		f.symlink("../../../"+g, dir+"/iommu_group")
	}
	if d.driver != "" {
		f.bindLink(d.addr, d.driver)
	}
	// Child directories the kernel always creates; the net lookup must
	// look into real subdirectories without tripping over them.
	f.mkdir(dir + "/power")
	f.mkdir(dir + "/msi_irqs")
	f.symlink("../../../bus/pci", dir+"/subsystem")
	for i, n := range d.nets {
		netDir := dir + "/net/" + n
		if d.virtioNet {
			netDir = dir + "/virtio0/net/" + n
		}
		f.mkdir(netDir)
		f.write(netDir+"/flags", "0x1002\n") // down, broadcast, multicast
		f.write(netDir+"/operstate", "down\n")
		f.write(netDir+"/ifindex", fmt.Sprintf("%d\n", i+2))
		f.symlink("../../"+netDir, "class/net/"+n)
	}
	if d.config != nil {
		if err := os.WriteFile(f.path(dir+"/config"), d.config, 0o644); err != nil {
			f.t.Fatal(err)
		}
	}
	if d.resource != "" {
		f.write(dir+"/resource", d.resource)
	}
}

// bindLink creates <dev>/driver the way the kernel does.
func (f *fakeSys) bindLink(addr, driver string) {
	f.symlink("../../../bus/pci/drivers/"+driver, f.devRel(addr)+"/driver")
}

// setLink sets an interface's flags and operstate.
func (f *fakeSys) setLink(name, flags, oper string) {
	f.write("class/net/"+name+"/flags", flags+"\n")
	f.write("class/net/"+name+"/operstate", oper+"\n")
}

// fakeKernel plays the kernel's part behind drivers_probe and each driver's
// unbind attribute, which it turns into FIFOs: every write is read by a
// goroutine that then changes the driver links as the kernel would, a
// moment after the writer has returned.
type fakeKernel struct {
	fs        *fakeSys
	native    map[string]string // address -> driver that claims it without override
	failProbe map[string]bool   // drivers whose probe fails
	// ignoreOverride makes probes pick the native driver regardless.
	ignoreOverride bool

	mu  sync.Mutex // guards log and the settings above, shared with the goroutines
	log []string

	stop  atomic.Bool
	wg    sync.WaitGroup
	fifos []string
}

func newFakeKernel(f *fakeSys, native map[string]string, drivers ...string) *fakeKernel {
	k := &fakeKernel{fs: f, native: native, failProbe: map[string]bool{}}
	k.serve("bus/pci/drivers_probe", k.probe)
	for _, d := range drivers {
		d := d
		k.serve("bus/pci/drivers/"+d+"/unbind", func(addr string) { k.unbind(d, addr) })
	}
	f.t.Cleanup(k.close)
	return k
}

func (k *fakeKernel) serve(rel string, handle func(string)) {
	p := k.fs.path(rel)
	_ = os.Remove(p)
	if err := syscall.Mkfifo(p, 0o644); err != nil {
		k.fs.t.Fatal(err)
	}
	k.fifos = append(k.fifos, p)
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		for {
			r, err := os.Open(p) // blocks until a writer opens the FIFO
			if err != nil {
				return
			}
			b, _ := io.ReadAll(r)
			r.Close()
			if k.stop.Load() {
				return
			}
			handle(strings.TrimSpace(string(b)))
		}
	}()
}

// close stops the goroutines: each is blocked opening its FIFO, so one
// open for writing releases it, and it sees stop after the read.
func (k *fakeKernel) close() {
	k.stop.Store(true)
	for _, p := range k.fifos {
		if w, err := os.OpenFile(p, os.O_WRONLY, 0); err == nil {
			w.Close()
		}
	}
	k.wg.Wait()
}

// set changes the kernel's settings while its goroutines run.
func (k *fakeKernel) set(change func()) {
	k.mu.Lock()
	change()
	k.mu.Unlock()
}

func (k *fakeKernel) record(s string) {
	k.mu.Lock()
	k.log = append(k.log, s)
	k.mu.Unlock()
}

func (k *fakeKernel) events() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.log...)
}

func (k *fakeKernel) unbind(driver, addr string) {
	k.record("unbind " + driver + " " + addr)
	link := k.fs.path(k.fs.devRel(addr) + "/driver")
	if t, err := os.Readlink(link); err == nil && filepath.Base(t) == driver {
		os.Remove(link)
	}
}

func (k *fakeKernel) probe(addr string) {
	k.record("probe " + addr)
	dir := k.fs.devRel(addr)
	if _, err := os.Readlink(k.fs.path(dir + "/driver")); err == nil {
		return // already bound: drivers_probe does nothing
	}
	b, _ := os.ReadFile(k.fs.path(dir + "/driver_override"))
	drv := strings.TrimSpace(string(b))
	k.mu.Lock()
	if drv == "" || drv == "(null)" || k.ignoreOverride {
		drv = k.native[addr]
	}
	fail := k.failProbe[drv]
	k.mu.Unlock()
	if drv == "" || fail {
		return
	}
	if _, err := os.Stat(k.fs.path("bus/pci/drivers/" + drv)); err != nil {
		return
	}
	k.fs.bindLink(addr, drv)
}
