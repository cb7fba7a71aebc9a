module github.com/vfnic/vfnic

go 1.26.3

require (
	github.com/cilium/ebpf v0.22.0 // nic/afxdp: its XDP redirect program is assembled in Go (asm) and attached as a bpf_link (link), with its XSKMAP; no clang
	github.com/gopacket/gopacket v1.7.7
	github.com/miekg/dns v1.1.73 // tests/netstackvm and examples/httpd: an unmodified DNS server on netstack
	github.com/quic-go/quic-go v0.65.0 // tests/netstackvm: an unmodified QUIC server on netstack
	github.com/stretchr/testify v1.12.1
	golang.org/x/net v0.57.0
	golang.org/x/sys v0.49.0
	gvisor.dev/gvisor v0.0.0-20260905035102-160fafc42237 // netstack; gVisor publishes only pseudo-versions of its go branch and reaches into runtime internals: this one declares go 1.26.3 and has the Go 1.26 runtime files
)

require (
	github.com/google/btree v1.1.2 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/crypto v0.54.0 // indirect
	golang.org/x/exp v0.0.0-20250711185948-6ae5c78190dc // indirect
	golang.org/x/time v0.15.0 // indirect
)
