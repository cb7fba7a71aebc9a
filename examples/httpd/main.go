// Command httpd serves a directory over HTTP from a NIC that vfnic drives,
// through package netstack: an unmodified net/http file server on gVisor's
// TCP/IP stack on a userspace driver. With -dns it also answers DNS
// queries (A and AAAA) for the names it is given, with github.com/miekg/dns
// on the same stack.
//
//	httpd -pci 0000:00:04.0 -addr 10.0.0.1/24 [-addr fd00::1/64] [-gw 10.0.0.254]
//	      [-dir /srv/www] [-port 80] [-dns name=10.0.0.1,fd00::1]...
//
// It runs until SIGINT or SIGTERM, or until the kernel takes the NIC back,
// and then prints the stack's frame counters.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/miekg/dns"

	"github.com/vfnic/vfnic/netstack"
	"github.com/vfnic/vfnic/nic"
	_ "github.com/vfnic/vfnic/nic/igb"
	_ "github.com/vfnic/vfnic/nic/virtio"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, " ") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(os.Stderr, "httpd: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("httpd", flag.ContinueOnError)
	pci := fs.String("pci", "", "PCI address of the NIC to take (required)")
	var addrs, names multi
	fs.Var(&addrs, "addr", "address with prefix length (repeatable, IPv4 and IPv6)")
	gw := fs.String("gw", "", "default gateway (IPv4 or IPv6)")
	dir := fs.String("dir", ".", "directory to serve")
	port := fs.Int("port", 80, "HTTP port")
	fs.Var(&names, "dns", "answer DNS queries on port 53 for name=addr[,addr...] (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *pci == "" || len(addrs) == 0 {
		return errors.New("-pci and -addr are required")
	}
	cfg := netstack.Config{}
	for _, a := range addrs {
		p, err := netip.ParsePrefix(a)
		if err != nil {
			return fmt.Errorf("-addr %q: %w", a, err)
		}
		cfg.Addrs = append(cfg.Addrs, p)
	}
	if *gw != "" {
		g, err := netip.ParseAddr(*gw)
		if err != nil {
			return fmt.Errorf("-gw %q: %w", *gw, err)
		}
		if g.Is4() {
			cfg.Gateway4 = g
		} else {
			cfg.Gateway6 = g
		}
	}
	zone, err := parseNames(names)
	if err != nil {
		return err
	}

	dev, err := nic.Open(ctx, *pci, nic.Config{})
	if err != nil {
		return err
	}
	defer dev.Close()
	n, err := netstack.New(dev, cfg)
	if err != nil {
		return err
	}
	defer n.Close()
	fmt.Printf("httpd: %s (%s), link MTU %d, addresses %s\n", *pci, dev.Info().Model, n.MTU(), addrs.String())

	l, err := n.Listen("tcp", fmt.Sprintf(":%d", *port))
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: logRequests(http.FileServer(http.Dir(*dir)))}
	served := make(chan error, 2)
	go func() { served <- srv.Serve(l) }()
	fmt.Printf("httpd: serving %s on port %d\n", *dir, *port)
	if len(zone) > 0 {
		pc, err := n.ListenPacket("udp", ":53")
		if err != nil {
			return err
		}
		ds := &dns.Server{PacketConn: pc, Handler: zone}
		go func() { served <- ds.ActivateAndServe() }()
		defer ds.Shutdown()
		fmt.Printf("httpd: answering DNS for %s on port 53\n", names.String())
	}
	fmt.Println("httpd: ready")
	select {
	case <-ctx.Done():
	case <-n.Done():
	case err = <-served:
	}
	_ = srv.Close()
	st := n.Stats()
	fmt.Printf("httpd: stopping (%v); frames received %d, sent %d, dropped %d/%d\n",
		context.Cause(ctx), st.RxFrames, st.TxFrames, st.RxDropped, st.TxDropped)
	if nerr := n.Err(); nerr != nil {
		return nerr
	}
	if errors.Is(err, http.ErrServerClosed) || errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// zone answers A and AAAA queries for its names.
type zone map[string][]netip.Addr

func parseNames(specs []string) (zone, error) {
	z := zone{}
	for _, s := range specs {
		name, list, ok := strings.Cut(s, "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("-dns %q: want name=addr[,addr...]", s)
		}
		for _, a := range strings.Split(list, ",") {
			ip, err := netip.ParseAddr(a)
			if err != nil {
				return nil, fmt.Errorf("-dns %q: %w", s, err)
			}
			z[dns.Fqdn(strings.ToLower(name))] = append(z[dns.Fqdn(strings.ToLower(name))], ip)
		}
	}
	return z, nil
}

// ServeDNS implements dns.Handler.
func (z zone) ServeDNS(w dns.ResponseWriter, q *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(q)
	m.Authoritative = true
	for _, qq := range q.Question {
		addrs, ok := z[strings.ToLower(qq.Name)]
		if !ok {
			m.Rcode = dns.RcodeNameError
			continue
		}
		for _, a := range addrs {
			hdr := dns.RR_Header{Name: qq.Name, Class: dns.ClassINET, Ttl: 60}
			switch {
			case qq.Qtype == dns.TypeA && a.Is4():
				hdr.Rrtype = dns.TypeA
				m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: a.AsSlice()})
			case qq.Qtype == dns.TypeAAAA && a.Is6():
				hdr.Rrtype = dns.TypeAAAA
				m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: a.AsSlice()})
			}
		}
	}
	fmt.Printf("httpd: dns %s from %v: %d answers\n", questions(q), w.RemoteAddr(), len(m.Answer))
	_ = w.WriteMsg(m)
}

func questions(q *dns.Msg) string {
	var s []string
	for _, qq := range q.Question {
		s = append(s, dns.TypeToString[qq.Qtype]+" "+qq.Name)
	}
	return strings.Join(s, ", ")
}

// logRequests prints each request as it is served.
func logRequests(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Printf("httpd: %s %s from %s\n", r.Method, r.URL.Path, r.RemoteAddr)
		h.ServeHTTP(w, r)
	})
}
