// Package leakcheck counts what a driver's Close must give back: open file
// descriptors, and the mappings of VFIO regions and hugepage memory. Other
// mappings are left out on purpose: the Go runtime maps, unmaps and merges
// its own regions at any time, so a raw line count of /proc/self/maps moves
// by itself.
package leakcheck

import (
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/vfnic/vfnic/eventfd"
)

// Resources is a process's count of open fds and device/DMA mappings.
type Resources struct {
	FDs  int // entries of /proc/self/fd
	Maps int // lines of /proc/self/maps naming vfio or hugepage memory
}

// String formats the counts for a test's failure message.
func (r Resources) String() string {
	return fmt.Sprintf("%d fds, %d device/DMA mappings", r.FDs, r.Maps)
}

var pollerOnce sync.Once

// Snapshot counts the process's resources now.
func Snapshot() (Resources, error) {
	// The runtime poller keeps its own fds once the first pollable fd used
	// it: start it before the first count so it does not look like a leak.
	pollerOnce.Do(func() {
		if e, err := eventfd.New(); err == nil {
			_ = e.Close()
		}
	})
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return Resources{}, err
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return Resources{}, err
	}
	n := 0
	for _, l := range strings.Split(string(maps), "\n") {
		// VFIO BARs map the device's anon inode ([vfio-device]); hugepage
		// memory shows as /anon_hugepage.
		if strings.Contains(l, "vfio") || strings.Contains(l, "huge") {
			n++
		}
	}
	return Resources{FDs: len(fds), Maps: n}, nil
}
