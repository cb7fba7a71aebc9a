package netstack_test

import (
	"context"
	"io"
	"log"
	"net/http"
	"net/netip"

	"github.com/vfnic/vfnic/netstack"
	"github.com/vfnic/vfnic/nic"
	_ "github.com/vfnic/vfnic/nic/igb"
	_ "github.com/vfnic/vfnic/nic/virtio"
)

// An unmodified net/http server on a NIC that vfnic drives. It needs a
// NIC to take (here the PCI device 0000:00:04.0), so it has no output to
// check.
func Example() {
	ctx := context.Background()
	dev, err := nic.Open(ctx, "0000:00:04.0", nic.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer dev.Close()
	n, err := netstack.New(dev, netstack.Config{
		Addrs:    []netip.Prefix{netip.MustParsePrefix("192.0.2.10/24"), netip.MustParsePrefix("2001:db8::10/64")},
		Gateway4: netip.MustParseAddr("192.0.2.1"),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer n.Close()
	l, err := n.Listen("tcp", ":80")
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello from vfnic\n")
	})))
}
