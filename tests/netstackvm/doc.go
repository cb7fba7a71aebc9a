// Package netstackvm tests package netstack in a QEMU guest with two NICs
// of one kind on one emulated wire (a QEMU hub): vfnic and the netstack on
// one, the guest's Linux on the other. Unmodified servers run on vfnic
// (net/http, github.com/miekg/dns, quic-go) and the guest's Linux side is
// the client (busybox wget and nslookup, Go programs on Linux sockets).
//
// TestVM, on the host, boots one guest per NIC kind (virtio packed and
// split, igb); in each,
// TestGuestNetstack runs every check on one stack.
package netstackvm
