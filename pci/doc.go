// Package pci discovers PCI devices through sysfs, reads their identity,
// moves them between kernel drivers with driver_override, checks that a
// device is not in use by the kernel's network stack before it is taken
// away, and decodes configuration space (capabilities and BARs).
//
// Everything that touches sysfs goes through a Sysfs value whose Root can
// point at a fake tree, and the configuration-space decoders read any
// io.ReaderAt (a sysfs config file, a VFIO config region, or a byte slice),
// so the package is testable without hardware. It knows nothing of VFIO.
package pci
