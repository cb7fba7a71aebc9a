// Command hostveth tries vfnic on any Linux host in seconds, with no NIC
// to take and no IOMMU: it makes two network namespaces joined by a veth
// pair, drives one end with vfnic's AF_XDP driver (nic/afxdp) and serves
// HTTP from an unmodified net/http server on netstack there, then asks
// Linux's curl (or wget) in the other namespace for a page. Nothing of
// the machine's own interfaces is touched, and everything it made is
// removed when it ends (also on Ctrl-C).
//
//	sudo go run ./examples/hostveth          # one request, then exit
//	sudo go run ./examples/hostveth -serve   # keep serving: try it yourself
//
// It needs root (network namespaces, AF_XDP, an XDP program) and the ip
// command (iproute2).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vfnic/vfnic/netstack"
	"github.com/vfnic/vfnic/nic"
	_ "github.com/vfnic/vfnic/nic/afxdp" // the "afxdp" scheme
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "hostveth: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	serve := flag.Bool("serve", false, "keep serving until Ctrl-C, printing how to ask")
	flag.Parse()
	if os.Geteuid() != 0 {
		return errors.New("run as root: it makes network namespaces, an AF_XDP socket and an XDP program")
	}
	nsA, nsB := fmt.Sprintf("vfnic-try-%d-a", os.Getpid()), fmt.Sprintf("vfnic-try-%d-b", os.Getpid())
	defer func() {
		for _, ns := range []string{nsA, nsB} {
			_ = exec.Command("ip", "netns", "del", ns).Run()
		}
	}()
	for _, args := range [][]string{
		{"netns", "add", nsA},
		{"netns", "add", nsB},
		{"-n", nsA, "link", "add", "vf0", "numrxqueues", "1", "numtxqueues", "1", "type", "veth",
			"peer", "name", "vf1", "numrxqueues", "1", "numtxqueues", "1", "netns", nsB},
		{"-n", nsA, "link", "set", "vf0", "up"},
		{"-n", nsB, "addr", "add", "10.99.0.2/24", "dev", "vf1"},
		{"-n", nsB, "link", "set", "vf1", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %v: %v: %s", args, err, out)
		}
	}
	// Linux's stack in B leaves TCP checksums to the veth "device"; through
	// XDP they would reach netstack unfinished (ethtool -K vf1 tx off).
	if err := inNetns(nsB, func() error { return txChecksumOff("vf1") }); err != nil {
		return err
	}
	var dev nic.Device
	if err := inNetns(nsA, func() (err error) {
		dev, err = nic.Open(ctx, "afxdp:vf0", nic.Config{})
		return err
	}); err != nil {
		return err
	}
	defer dev.Close()
	in := dev.Info()
	fmt.Printf("vfnic: %s, %s, %v, MAC %s\n", in.Address, in.Model, in.Features, in.MAC)
	n, err := netstack.New(dev, netstack.Config{Addrs: []netip.Prefix{netip.MustParsePrefix("10.99.0.1/24")}})
	if err != nil {
		return err
	}
	defer n.Close()
	l, err := n.Listen("tcp", "10.99.0.1:80")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from vfnic: net/http on netstack on AF_XDP (%s), asked for %s\n", in.Address, r.URL.Path)
	})}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close()

	client := []string{"curl", "-sS", "--max-time", "10"}
	if _, err := exec.LookPath("curl"); err != nil {
		client = []string{"wget", "-q", "-O", "-", "-T", "10"}
	}
	ask := append(append([]string{"ip", "netns", "exec", nsB}, client...), "http://10.99.0.1/")
	if *serve {
		fmt.Printf("serving on 10.99.0.1:80 in namespace %s; from another shell:\n  sudo %s\nCtrl-C ends it and removes the namespaces\n",
			nsA, strings.Join(ask, " "))
		select {
		case <-ctx.Done():
		case <-n.Done():
			return n.Err()
		}
		return nil
	}
	fmt.Printf("linux: %s\n", strings.Join(ask, " "))
	out, err := exec.CommandContext(ctx, ask[0], ask[1:]...).CombinedOutput()
	fmt.Printf("%s", out)
	if err != nil {
		return fmt.Errorf("%s: %w", client[0], err)
	}
	st := n.Stats()
	fmt.Printf("netstack: %d frames in, %d out\n", st.RxFrames, st.TxFrames)
	return nil
}

// inNetns runs f on a thread in namespace ns (as ip netns exec does for
// a command); the thread returns to this namespace afterwards, or ends.
func inNetns(ns string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		back, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- err
			return
		}
		defer back.Close()
		there, err := os.Open("/run/netns/" + ns)
		if err != nil {
			errc <- err
			return
		}
		defer there.Close()
		if err := unix.Setns(int(there.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		err = f()
		if unix.Setns(int(back.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// txChecksumOff is ethtool -K ifname tx off (ETHTOOL_STXCSUM).
func txChecksumOff(ifname string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	val := struct{ cmd, data uint32 }{cmd: unix.ETHTOOL_STXCSUM}
	var ifr struct {
		name [unix.IFNAMSIZ]byte
		data uintptr
		_    [16]byte
	}
	copy(ifr.name[:], ifname)
	ifr.data = uintptr(unsafe.Pointer(&val))
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); e != 0 {
		return fmt.Errorf("ETHTOOL_STXCSUM on %s: %w", ifname, e)
	}
	return nil
}
