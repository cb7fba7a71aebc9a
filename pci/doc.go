// Package pci discovers PCI devices through sysfs, reads their identity,
// moves them between kernel drivers with driver_override, checks that a
// device is not in use by the kernel's network stack before it is taken
// away, and decodes configuration space (capabilities and BARs).
//
// Taking and giving back are safe by default: Take records the driver a
// device had so that Claim.Release can return it; GiveBack unbinds only
// vfio-pci devices (a kernel driver's device needs force, and still the
// in-use check) and refuses a device a process holds open, naming the
// process from /proc, where the kernel's unbind would block until it let
// go.
//
// Everything that touches sysfs goes through a Sysfs value whose Root can
// point at a fake tree, and the configuration-space decoders read any
// io.ReaderAt (a sysfs config file, a VFIO config region, or a byte slice),
// so the package is testable without hardware. It knows nothing of VFIO's
// ioctls: it only recognises its device nodes among a process's files.
package pci
