package afxdp

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// progName is the name of the XDP program this package attaches.
const progName = "vfnic_xsk"

// redirect is the XDP program and XSKMAP of one interface, attached as a
// bpf_link: closing it detaches the program (and the kernel does when the
// process dies).
type redirect struct {
	xsks   *ebpf.Map
	prog   *ebpf.Program
	link   link.Link
	native bool // driver mode; generic (SKB) mode otherwise
}

// newRedirect loads the program that sends the frames of each queue with
// a socket in the map to it, and the others to the kernel's stack, for an
// interface of nq queues. It is not attached yet.
func newRedirect(nq int) (*redirect, error) {
	m, err := ebpf.NewMap(&ebpf.MapSpec{Name: "vfnic_xsks", Type: ebpf.XSKMap, KeySize: 4, ValueSize: 4, MaxEntries: uint32(nq)})
	if err != nil {
		return nil, permission(fmt.Errorf("afxdp: XSKMAP of %d queues: %w", nq, err))
	}
	mapPtr := asm.LoadMapPtr(asm.R1, 0)
	if err := mapPtr.AssociateMap(m); err != nil {
		_ = m.Close()
		return nil, err
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: progName, Type: ebpf.XDP, License: "Dual MIT/GPL",
		Instructions: asm.Instructions{
			// bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS): the
			// low bits of the flags are the action when the queue has no
			// socket in the map.
			asm.LoadMem(asm.R2, asm.R1, 16, asm.Word), // struct xdp_md.rx_queue_index
			mapPtr,
			asm.Mov.Imm(asm.R3, 2), // XDP_PASS
			asm.FnRedirectMap.Call(),
			asm.Return(),
		},
	})
	if err != nil {
		_ = m.Close()
		return nil, permission(fmt.Errorf("afxdp: load the XDP program: %w", err))
	}
	return &redirect{xsks: m, prog: prog}, nil
}

// attach links the program to the interface, in driver mode where the
// driver has it, else generic mode. An XDP program already there is
// someone else's: refused with ErrXDPInUse, or with force detached first
// (when it was attached through netlink; a bpf_link cannot be).
func (r *redirect) attach(ifname string, ifindex int, force bool) error {
	for try := 0; ; try++ {
		l, err := link.AttachXDP(link.XDPOptions{Program: r.prog, Interface: ifindex, Flags: link.XDPDriverMode})
		if err == nil {
			r.link, r.native = l, true
			return nil
		}
		if !errors.Is(err, unix.EBUSY) && !errors.Is(err, unix.EEXIST) && !errors.Is(err, unix.EPERM) {
			// The driver has no native XDP, or not in this configuration
			// (veth: fewer receive queues than its peer's transmit
			// queues, ENOSPC): the generic hook takes any driver.
			l, err = link.AttachXDP(link.XDPOptions{Program: r.prog, Interface: ifindex, Flags: link.XDPGenericMode})
			if err == nil {
				r.link = l
				return nil
			}
		}
		if !errors.Is(err, unix.EBUSY) && !errors.Is(err, unix.EEXIST) {
			return permission(fmt.Errorf("afxdp: attach XDP program to %s: %w", ifname, err))
		}
		if !force {
			return fmt.Errorf("%w: %s (%v): detach it (ip link set dev %s xdp off) or open with Config.Force", ErrXDPInUse, ifname, err, ifname)
		}
		// The kernel refuses a netlink detach of a program a bpf_link
		// holds (EBUSY), and a detach in the mode that has no program
		// succeeds doing nothing: a refusal after a detach that said yes
		// is a bpf_link's program too.
		derr := errHeldByLink
		if try == 0 {
			derr = detachXDP(ifindex)
		}
		if derr != nil {
			return fmt.Errorf("%w: %s (%v): Config.Force could not detach it: %w", ErrXDPInUse, ifname, err, derr)
		}
	}
}

// errHeldByLink says why Config.Force leaves a program in place.
var errHeldByLink = errors.New("it is held by a bpf_link, which only its owner can detach (closing the link, or ending its process)")

// set puts the socket fd in the map at queue q.
func (r *redirect) set(q, fd int) error {
	if err := r.xsks.Put(uint32(q), uint32(fd)); err != nil {
		return fmt.Errorf("afxdp: XSKMAP entry of queue %d: %w", q, err)
	}
	return nil
}

// close detaches the program and releases it and the map.
func (r *redirect) close() error {
	var errs []error
	if r.link != nil {
		errs = append(errs, r.link.Close())
	}
	errs = append(errs, r.prog.Close(), r.xsks.Close())
	return errors.Join(errs...)
}

// permission makes an EPERM from the bpf(2) system call an ErrPermission.
func permission(err error) error {
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
		return fmt.Errorf("%w: %w", ErrPermission, err)
	}
	return err
}

// detachXDP removes the XDP program attached to the interface through
// netlink, in either mode (RTM_SETLINK with IFLA_XDP_FD -1).
func detachXDP(ifindex int) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink socket: %w", err)
	}
	defer unix.Close(fd)
	var errs []error
	for _, mode := range []uint32{unix.XDP_FLAGS_SKB_MODE, unix.XDP_FLAGS_DRV_MODE} {
		if err := setLinkXDP(fd, ifindex, -1, mode); errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("%w (%v)", errHeldByLink, err)
		} else if err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 2 {
		return errors.Join(errs...)
	}
	return nil // one mode had it
}

// setLinkXDP sends one RTM_SETLINK that attaches program prog (a
// program's fd; -1 detaches) in the given mode, and reads the kernel's
// answer.
func setLinkXDP(fd, ifindex int, prog int32, mode uint32) error {
	le := binary.LittleEndian // netlink is host order; vfnic runs on little-endian hosts (cq/ring checks too)
	attr := func(typ uint16, payload []byte) []byte {
		b := make([]byte, 4, 4+len(payload)+3)
		le.PutUint16(b[0:], uint16(4+len(payload)))
		le.PutUint16(b[2:], typ)
		b = append(b, payload...)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
		return b
	}
	u32 := func(v uint32) []byte { b := make([]byte, 4); le.PutUint32(b, v); return b }
	xdp := append(attr(unix.IFLA_XDP_FD, u32(uint32(prog))), attr(unix.IFLA_XDP_FLAGS, u32(mode))...)
	body := make([]byte, unix.SizeofIfInfomsg)
	le.PutUint32(body[4:], uint32(ifindex)) // ifi_index
	body = append(body, attr(unix.IFLA_XDP|unix.NLA_F_NESTED, xdp)...)
	msg := make([]byte, unix.NLMSG_HDRLEN, unix.NLMSG_HDRLEN+len(body))
	le.PutUint32(msg[0:], uint32(unix.NLMSG_HDRLEN+len(body)))
	le.PutUint16(msg[4:], unix.RTM_SETLINK)
	le.PutUint16(msg[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	le.PutUint32(msg[8:], 1)
	msg = append(msg, body...)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("netlink send: %w", err)
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return fmt.Errorf("netlink answer: %w", err)
	}
	if n < unix.NLMSG_HDRLEN+4 || le.Uint16(buf[4:]) != unix.NLMSG_ERROR {
		return fmt.Errorf("netlink: unexpected answer of %d bytes", n)
	}
	if code := int32(le.Uint32(buf[unix.NLMSG_HDRLEN:])); code != 0 {
		return fmt.Errorf("netlink RTM_SETLINK (mode %#x): %w", mode, unix.Errno(-code))
	}
	return nil
}
