package vfio

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestOpenContainerMissing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vfio", "vfio")
	_, err := OpenContainerAt(path)
	if !errors.Is(err, ErrNoVFIO) || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("err %v, want ErrNoVFIO and fs.ErrNotExist", err)
	}
	if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "modules are not loaded") {
		t.Errorf("unclear error: %v", err)
	}
}

func TestOpenContainerNotVFIO(t *testing.T) {
	file := filepath.Join(t.TempDir(), "vfio")
	if err := os.WriteFile(file, []byte("not a device"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{file, "/dev/null"} {
		_, err := OpenContainerAt(path)
		if !errors.Is(err, ErrNotVFIO) || !errors.Is(err, unix.ENOTTY) {
			t.Errorf("%s: err %v, want ErrNotVFIO wrapping ENOTTY", path, err)
		}
		if err != nil && !strings.Contains(err.Error(), "VFIO_GET_API_VERSION") {
			t.Errorf("%s: error does not name the ioctl: %v", path, err)
		}
	}
}

// testContainer is a Container whose group directory is dir, as if
// OpenContainerAt(dir/vfio) had succeeded.
func testContainer(dir string) *Container {
	return &Container{path: filepath.Join(dir, "vfio"), dir: dir, made: true, fd: -1, iommu: newFakeType1(holeyRanges...)}
}

func TestOpenGroupNotAGroup(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "12"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := testContainer(dir)
	_, err := c.OpenGroup(12)
	if !errors.Is(err, ErrNotVFIO) || !strings.Contains(err.Error(), "VFIO_GROUP_GET_STATUS") ||
		!strings.Contains(err.Error(), filepath.Join(dir, "12")) {
		t.Errorf("regular file as group: %v", err)
	}
	if len(c.groups) != 0 || c.iommuSet {
		t.Error("failed OpenGroup changed the container")
	}
}

func TestOpenGroupMissing(t *testing.T) {
	c := testContainer(t.TempDir())
	_, err := c.OpenGroup(7)
	if !errors.Is(err, ErrNoDevice) || !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "group 7") {
		t.Errorf("missing group: %v", err)
	}
	if _, err := c.OpenGroup(-1); !errors.Is(err, ErrInvalid) {
		t.Errorf("negative group: %v", err)
	}
	c.closed = true
	if _, err := c.OpenGroup(7); !errors.Is(err, ErrClosed) {
		t.Errorf("closed container: %v", err)
	}
}

func TestOpenDeviceBadName(t *testing.T) {
	g := &Group{c: testContainer(t.TempDir()), num: 1, fd: -1}
	for _, name := range []string{"", "0000:00:04.0\x00evil"} {
		if _, err := g.OpenDevice(name); !errors.Is(err, ErrInvalid) {
			t.Errorf("name %q: %v", name, err)
		}
	}
	// An fd that is not a group: the ioctl fails and the error names it.
	f, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g.fd = int(f.Fd())
	_, err = g.OpenDevice("0000:00:04.0")
	if err == nil || !strings.Contains(err.Error(), "VFIO_GROUP_GET_DEVICE_FD") || !strings.Contains(err.Error(), "0000:00:04.0") {
		t.Errorf("device on /dev/null: %v", err)
	}
}

func TestCheckGroupStatus(t *testing.T) {
	if err := checkGroupStatus(5, "/dev/vfio/5", groupFlagsViable); err != nil {
		t.Errorf("viable group refused: %v", err)
	}
	err := checkGroupStatus(5, "/dev/vfio/5", 0)
	if !errors.Is(err, ErrGroupNotViable) {
		t.Fatalf("non-viable group: %v", err)
	}
	for _, s := range []string{"group 5", "/dev/vfio/5", "vfio-pci", "/sys/kernel/iommu_groups/5/devices"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
	if err := checkGroupStatus(5, "/dev/vfio/5", groupFlagsViable|groupFlagsContainerSet); !errors.Is(err, ErrBusy) {
		t.Errorf("group already in a container: %v", err)
	}
}

func TestOpenDeviceTwice(t *testing.T) {
	g := &Group{c: testContainer(t.TempDir()), num: 1, fd: -1}
	g.devices = []*Device{{addr: "0000:00:04.0"}}
	_, err := g.OpenDevice("0000:00:04.0")
	if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "0000:00:04.0") {
		t.Errorf("second open: %v", err)
	}
}
