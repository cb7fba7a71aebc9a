// Command vfnic-demo boots a QEMU guest with two NICs of one model
// (virtio-net, or the Intel 82576 with -nic igb) on one emulated wire and
// runs vfnic against real traffic in it: 'vfnic echo' drives one NIC
// through VFIO, the guest's Linux pings it and sends UDP from the other
// with its own driver (virtio_net, igb); then examples/httpd serves HTTP
// and DNS from Go servers on the same NIC (package netstack), and the
// guest's Linux fetches a page and resolves a name from them. 'make demo' runs it ('make demo
// NIC=igb' for igb). It lives apart from cmd/vfnic so that the operator's
// binary carries no VM harness.
//
//	vfnic-demo [-console] [-nic virtio|igb] [-split]
//
// Exit status: 0 when every ping, datagram, page and name was answered, 1 otherwise,
// 2 for a malformed command line.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/vfnic/vfnic/qemu"
)

// The demo topology: two NICs on one emulated wire (a QEMU hub).
// vfnic drives the first through VFIO; the guest's Linux drives the second.
const (
	demoVfnicAddr = "0000:00:04.0"
	demoVfnicIP   = "10.0.0.1"
	demoLinuxIP   = "10.0.0.2/24"
	demoName      = "demo.vfnic"
)

// demoScript runs in the guest: vfnic echo on one NIC; busybox ping and
// vfnic udpping (a client of the kernel's stack) on the other. Then
// examples/httpd takes the same NIC (net/http and a DNS server on
// package netstack), and busybox nslookup and wget ask it from Linux.
const demoScript = `#!/bin/sh
V=/vfnic/bin/vfnic
# ready NAME PID LOG: wait until the program at PID says "ready" in LOG.
ready() {
	i=0
	while ! grep -q ready "$3" 2>/dev/null; do
		i=$((i+1))
		if [ $i -gt 200 ] || ! kill -0 "$2" 2>/dev/null; then
			echo "$1 did not start:"; cat "$3"; exit 1
		fi
		sleep 0.1
	done
}
echo '$ vfnic list'
$V list
echo '$ vfnic echo -ip ` + demoVfnicIP + ` ` + demoVfnicAddr + ` &'
$V echo -ip ` + demoVfnicIP + ` -progress 1s ` + demoVfnicAddr + ` >/tmp/echo.log 2>&1 &
pid=$!
ready 'vfnic echo' $pid /tmp/echo.log
echo '$ ping -c 20 -i 0.2 ` + demoVfnicIP + `   (the Linux driver on the other NIC)'
ping -c 20 -i 0.2 ` + demoVfnicIP + `
ping_status=$?
echo '$ vfnic udpping -count 20 -size 512 ` + demoVfnicIP + `:7   (UDP through the Linux stack)'
$V udpping -count 20 -size 512 -interval 50ms ` + demoVfnicIP + `:7
udp_status=$?
kill -INT $pid
wait $pid
echo_status=$?
echo '--- vfnic echo output (progress every second, then its summary and counters):'
sed 's/^/[vfnic echo] /' /tmp/echo.log
echo "ping exit $ping_status, udpping exit $udp_status, vfnic echo exit $echo_status"
mkdir -p /tmp/www
echo 'hello from net/http on vfnic + netstack' >/tmp/www/index.html
echo '$ httpd -pci ` + demoVfnicAddr + ` -addr ` + demoVfnicIP + `/24 -dir /tmp/www -dns ` + demoName + `=` + demoVfnicIP + ` &   (Go servers on gVisor netstack on vfnic)'
/vfnic/bin/httpd -pci ` + demoVfnicAddr + ` -addr ` + demoVfnicIP + `/24 -dir /tmp/www -dns ` + demoName + `=` + demoVfnicIP + ` >/tmp/httpd.log 2>&1 &
hpid=$!
ready httpd $hpid /tmp/httpd.log
echo '$ nslookup ` + demoName + ` ` + demoVfnicIP + `   (busybox, through the Linux stack)'
nslookup ` + demoName + ` ` + demoVfnicIP + `
ns_status=$?
echo '$ wget -q -O - http://` + demoVfnicIP + `/'
wget -q -O - http://` + demoVfnicIP + `/
wget_status=$?
kill -INT $hpid
wait $hpid
httpd_status=$?
echo '--- httpd output:'
sed 's/^/[httpd] /' /tmp/httpd.log
echo "nslookup exit $ns_status, wget exit $wget_status, httpd exit $httpd_status"
[ $ping_status = 0 ] && [ $udp_status = 0 ] && [ $echo_status = 0 ] && [ $ns_status = 0 ] && [ $wget_status = 0 ] && [ $httpd_status = 0 ]
`

// errUsage marks a malformed command line: exit status 2.
var errUsage = errors.New("usage")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := runDemo(ctx, os.Args[1:], os.Stdout)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	case errors.Is(err, errUsage):
		fmt.Fprintf(os.Stderr, "vfnic-demo: %v\n", err)
		os.Exit(2)
	default:
		fmt.Fprintf(os.Stderr, "vfnic-demo: %v\n", err)
		os.Exit(1)
	}
}

func runDemo(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("vfnic-demo", flag.ContinueOnError)
	fs.SetOutput(out) // -h prints to stdout
	console := fs.Bool("console", false, "also show the guest's serial console")
	model := fs.String("nic", "virtio", "NIC model: virtio (virtio-net) or igb (Intel 82576)")
	split := fs.Bool("split", false, "give vfnic's virtio-net NIC split virtqueues instead of packed ones")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("%w: vfnic-demo takes no arguments", errUsage)
	}
	var nicModel qemu.NICModel
	switch *model {
	case "virtio":
		nicModel = qemu.VirtioNet
	case "igb":
		nicModel = qemu.IGB
		if *split {
			return fmt.Errorf("%w: -split is for virtio-net, not igb", errUsage)
		}
	default:
		return fmt.Errorf("%w: -nic %q: want virtio or igb", errUsage, *model)
	}
	linuxSlot := 5
	if nicModel == qemu.IGB {
		linuxSlot = 6 // an igb's SR-IOV functions take the slot after its own
	}
	if err := qemu.Available(ctx); err != nil {
		return err
	}
	bin, cleanup, err := guestBinary(ctx, "github.com/vfnic/vfnic/cmd/vfnic", "vfnic")
	if err != nil {
		return err
	}
	defer cleanup()
	httpd, cleanupHTTPD, err := guestBinary(ctx, "github.com/vfnic/vfnic/examples/httpd", "httpd")
	if err != nil {
		return err
	}
	defer cleanupHTTPD()
	dir, err := os.MkdirTemp("", "vfnic-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	script := filepath.Join(dir, "demo.sh")
	if err := os.WriteFile(script, []byte(demoScript), 0o755); err != nil {
		return err
	}

	cfg := qemu.Config{
		NICs: []qemu.NIC{
			{Model: nicModel, Packed: nicModel == qemu.VirtioNet && !*split, Slot: 4, Bind: qemu.BindVFIO, Net: qemu.Hub(0)},
			// Linux's NIC has split virtqueues: with packed ones, QEMU 10
			// and Linux 6.1 can stop its transmit queue for good once
			// vfnic's NIC has taken no frame for a moment (before its first
			// fill), which is theirs, not vfnic's (tests/netstackvm
			// TestVMPeerStall).
			{Model: nicModel, Slot: linuxSlot, Bind: qemu.BindLinux, IPv4: demoLinuxIP, Net: qemu.Hub(0)},
		},
		Files: []qemu.File{
			{Host: bin, Guest: "/vfnic/bin/vfnic", Mode: 0o755},
			{Host: httpd, Guest: "/vfnic/bin/httpd", Mode: 0o755},
			{Host: script, Guest: "/vfnic/demo.sh", Mode: 0o755},
		},
		Output:  prefixWriter(out, "guest| "),
		Timeout: 3 * time.Minute,
	}
	if *console {
		cfg.Console = prefixWriter(out, "console| ")
	}
	fmt.Fprintf(out, "vfnic demo: booting a q35 guest (TCG, intel-iommu) with two %s NICs on one emulated wire:\n", nicModel)
	how, linux := "Intel 82576", "igb"
	if nicModel == qemu.VirtioNet {
		how, linux = "packed virtqueues", "virtio_net (split virtqueues)"
		if *split {
			how = "split virtqueues"
		}
	}
	fmt.Fprintf(out, "  %s driven by vfnic through VFIO (%s), answering for %s\n", demoVfnicAddr, how, demoVfnicIP)
	fmt.Fprintf(out, "  %s left to the guest's Linux %s driver, %s\n", cfg.NICs[1].GuestAddr(), linux, demoLinuxIP)
	fmt.Fprintf(out, "  then examples/httpd on %s: net/http and a DNS server on gVisor's netstack, asked by busybox wget and nslookup\n", demoVfnicAddr)
	res, err := qemu.Run(ctx, cfg, qemu.Command{GuestPath: "/bin/sh", Args: []string{"/vfnic/demo.sh"}})
	if res != nil {
		fmt.Fprintf(out, "vfnic demo: guest kernel %s, boot %v, whole run %v, exit status %d\n",
			res.KernelVersion, res.Boot.Round(time.Millisecond), res.Duration.Round(time.Millisecond), res.ExitCode)
	}
	return err
}

// guestBinary builds a static (CGO_ENABLED=0) binary of pkg for the guest.
func guestBinary(ctx context.Context, pkg, name string) (string, func(), error) {
	dir, err := os.MkdirTemp("", "vfnic-demo-")
	if err != nil {
		return "", nil, err
	}
	bin := filepath.Join(dir, name)
	if err := qemu.BuildBinary(ctx, pkg, bin); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("build a static %s for the guest (run from the source tree): %w", name, err)
	}
	return bin, func() { os.RemoveAll(dir) }, nil
}

// prefixWriter writes each line to w behind prefix.
func prefixWriter(w io.Writer, prefix string) io.Writer {
	return &lineWriter{w: w, prefix: prefix}
}

type lineWriter struct {
	w      io.Writer
	prefix string
	buf    strings.Builder
}

func (l *lineWriter) Write(p []byte) (int, error) {
	for _, b := range p {
		if b == '\n' {
			if _, err := fmt.Fprintf(l.w, "%s%s\n", l.prefix, l.buf.String()); err != nil {
				return 0, err
			}
			l.buf.Reset()
			continue
		}
		l.buf.WriteByte(b)
	}
	return len(p), nil
}
