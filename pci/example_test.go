package pci_test

import (
	"errors"
	"fmt"

	"github.com/vfnic/vfnic/pci"
)

// Addresses are accepted as sysfs names them and as lspci prints them;
// String gives the sysfs form that the rest of vfnic takes.
func ExampleParseAddress() {
	for _, s := range []string{"0000:00:04.0", "3b:00.1", "0000:00:20.0", "00:04"} {
		a, err := pci.ParseAddress(s)
		if err != nil {
			fmt.Println(err, errors.Is(err, pci.ErrBadAddress))
			continue
		}
		fmt.Println(a, a.Bus, a.Device, a.Function)
	}
	// Output:
	// 0000:00:04.0 0 4 0
	// 0000:3b:00.1 59 0 1
	// pci: bad address "0000:00:20.0": device must be 1 or 2 hex digits from 00 to 1f, got "20" true
	// pci: bad address "00:04": missing ".function" true
}
