// Package platform holds the platform VM tests: the TestGuest* tests run
// inside a QEMU guest (they need VFIO, hugepages and emulated NICs behind an
// emulated IOMMU) and skip elsewhere; TestVM, on the host, boots that guest,
// runs them there and fails unless every one of them passed.
package platform
