package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
)

// ErrNotInGuest is returned by guest-only helpers called outside a vfnic guest.
var ErrNotInGuest = errors.New("qemu: not running in a vfnic guest (VFNIC_GUEST is not 1)")

// InGuest reports whether this process runs as the payload of a vfnic guest
// (VFNIC_GUEST=1), where the NICs are bound to vfio-pci and hugepages exist.
func InGuest() bool { return os.Getenv("VFNIC_GUEST") == "1" }

// GuestNICs returns the guest's NICs as the host configured them (model,
// slot, so GuestAddr, MAC, binding, backend), from $VFNIC_GUEST_NICS.
func GuestNICs() ([]NIC, error) {
	if !InGuest() {
		return nil, ErrNotInGuest
	}
	return ParseNICs(os.Getenv("VFNIC_GUEST_NICS"))
}

// SkipUnlessGuest skips a test that needs the guest's VFIO devices when it
// runs anywhere else, saying how to run it.
func SkipUnlessGuest(t testing.TB) {
	t.Helper()
	if !InGuest() {
		t.Skip("needs VFIO devices of a vfnic QEMU guest: run it with qemu.RunGoTest or `go test -exec vmexec`")
	}
}

// InCI reports whether the CI environment variable says this is a CI run.
func InCI() bool {
	v := strings.ToLower(os.Getenv("CI"))
	return v == "true" || v == "1" || v == "yes"
}

// Available checks that a VM can run: QEMU runs, and a guest kernel and a
// static busybox are in place. The error wraps ErrNoQEMU, ErrNoKernel or ErrNoBusybox.
func Available(ctx context.Context) error {
	q, err := FindQEMU()
	if err != nil {
		return err
	}
	if _, err := Probe(ctx, q); err != nil {
		return err
	}
	if _, err := FindKernel(); err != nil {
		return err
	}
	if _, err := FindBusybox(); err != nil {
		return err
	}
	return nil
}

// RequireVM stops a host test that needs a VM when none can run: under CI
// (CI=true) it fails loudly, since a CI that silently skips the VM tests
// proves nothing; elsewhere it skips, naming the setup script.
func RequireVM(t testing.TB) {
	t.Helper()
	err := Available(context.Background())
	if err == nil {
		return
	}
	msg := fmt.Sprintf("VM test cannot run: %v", err)
	if InCI() {
		t.Fatal(msg + " (CI=true: VM tests must run)")
	}
	t.Skip(msg)
}
