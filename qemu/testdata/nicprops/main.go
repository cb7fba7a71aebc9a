// Command nicprops runs in a guest of the qemu package's tests: it reports
// what the guest's Linux sees of each network interface (MTU, virtio
// features, ring sizes) as JSON, and writes a large file whose bytes the
// host can regenerate, both under -out for the host to bring back.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vfnic/vfnic/internal/ethtool"
)

// NIC is what the guest sees of one interface.
type NIC struct {
	Name      string `json:"name"`
	MAC       string `json:"mac"`
	MTU       int    `json:"mtu"`
	EventIdx  bool   `json:"event_idx"` // VIRTIO_RING_F_EVENT_IDX, bit 29
	MrgRxbuf  bool   `json:"mrg_rxbuf"` // VIRTIO_NET_F_MRG_RXBUF, bit 15
	FeatMTU   bool   `json:"feat_mtu"`  // VIRTIO_NET_F_MTU, bit 3
	RxRingMax uint32 `json:"rx_ring_max"`
	TxRingMax uint32 `json:"tx_ring_max"`
}

func main() {
	out := flag.String("out", "/vfnic/out", "directory to write into")
	blob := flag.Int("blob", 6<<20, "bytes of the generated file")
	flag.Parse()
	if err := run(*out, *blob); err != nil {
		fmt.Fprintln(os.Stderr, "nicprops:", err)
		os.Exit(1)
	}
}

func run(out string, blob int) error {
	ifs, err := filepath.Glob("/sys/class/net/eth*")
	if err != nil {
		return err
	}
	var nics []NIC
	for _, d := range ifs {
		n := NIC{Name: filepath.Base(d)}
		n.MAC = readString(d + "/address")
		n.MTU, _ = strconv.Atoi(readString(d + "/mtu"))
		// The interface's device is the virtio device, which lists the
		// negotiated feature bits as a string of 0s and 1s, bit 0 first.
		f := readString(d + "/device/features")
		bit := func(i int) bool { return len(f) > i && f[i] == '1' }
		n.EventIdx, n.MrgRxbuf, n.FeatMTU = bit(29), bit(15), bit(3)
		r, err := ethtool.GetRings(n.Name)
		if err != nil {
			return err
		}
		n.RxRingMax, n.TxRingMax = r.RxMax, r.TxMax
		nics = append(nics, n)
	}
	b, err := json.MarshalIndent(nics, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "props.json"), b, 0o644); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(out, "tree", "sub"), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "tree", "sub", "note.txt"), []byte("from the guest\n"), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(out, "blob.bin"), Blob(blob), 0o644)
}

// Blob returns n bytes the host regenerates to check the transfer.
func Blob(n int) []byte {
	r := rand.New(rand.NewPCG(7, 9))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func readString(p string) string {
	b, _ := os.ReadFile(p)
	return strings.TrimSpace(string(b))
}
