# vfnic: the two entry points a newcomer needs are `make demo` and `make test`.
# Both install what is missing first (scripts/setup.sh) and are quick when
# everything is present.

SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
export PATH := $(PATH):/usr/local/go/bin
GO ?= go
# Keep the whole suite inside CI's budget on 2 cores.
TEST_TIMEOUT ?= 20m

.PHONY: all setup deps build vet test test-host test-vm demo bench bench-vm bench-netstack bench-hostdev fuzz soak clean

all: build

setup:
	@command -v $(GO) >/dev/null || { echo "vfnic: Go 1.26+ is required (expected at /usr/local/go/bin)"; exit 1; }
	@bash scripts/setup.sh

deps: setup
	@$(GO) mod download

build: deps
	CGO_ENABLED=0 $(GO) build ./...

vet: deps
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

# All tests, host unit tests under the race detector and the VM tests that
# boot QEMU guests (those fail, never skip, under CI=true). testsum lists
# every VM and guest test with its verdict and the guest kernel it booted,
# prints what failed in full, and ends with "N passed, N failed, N skipped".
# The packages whose tests boot guests (their tests import the qemu
# package) run with -p 1, one at a time, so two TCG guests (2 vCPUs each)
# never share the 2-core machine (starved guests froze under load); the
# others run first, two at a time.
# The second run builds the test-only hooks in (-tags vfnictest): the
# test that counts how often the ring reader decodes an entry.
VM_PKGS = grep -rl --include='*_test.go' '"github.com/vfnic/vfnic/qemu"' . | xargs -n1 dirname | \
	grep -v testdata | sort -u | sed 's|^\.|github.com/vfnic/vfnic|'

test: vet
	@$(GO) build -o /tmp/vfnic-testsum ./tests/testsum
	@vm="$$($(VM_PKGS))"; host="$$($(GO) list ./... | grep -vxF "$$vm")"; \
	{ $(GO) test -p 2 -race -count=1 -json -timeout $(TEST_TIMEOUT) $$host ; \
	  $(GO) test -p 1 -race -count=1 -json -timeout $(TEST_TIMEOUT) $$vm ; \
	  $(GO) test -race -count=1 -json -tags vfnictest -run 'OneDecode' ./nic/virtio ; } | /tmp/vfnic-testsum

# The main job: boot a guest with emulated NICs and run vfnic against them
# (virtio-net; NIC=igb for the Intel 82576).
demo: deps
	$(GO) run ./cmd/vfnic-demo $(if $(NIC),-nic $(NIC))

bench: deps
	$(GO) test -run '^$$' -bench . -benchmem ./...

# The side-by-side packet-rate benchmark in one guest (bench/vm): vfnic's
# polling modes against DPDK testpmd (Debian's packages, fetched into the
# cache and put into the guest) and the guest's Linux drivers, on virtio
# packed, split and igb, A B A B. About 30 minutes; not part of make test.
# BENCHVM_FLAGS are passed on (e.g. -reps 3 -dur 10s -nics igb -v).
BENCHVM_FLAGS ?=
bench-vm: deps
	$(GO) run ./bench/vm $(BENCHVM_FLAGS)

# The same Go UDP echo and HTTP servers on vfnic+netstack and on the
# guest's Linux sockets, one guest, A B A B (bench/netstack); not part of
# make test. BENCHNS_FLAGS are passed on (e.g. -nic igb -reps 3 -dur 10s).
BENCHNS_FLAGS ?=
bench-netstack: deps
	$(GO) run ./bench/netstack $(BENCHNS_FLAGS)

# vfnic's host devices (afxdp:, afpacket:) against DPDK testpmd's
# net_af_xdp and net_af_packet and plain AF_PACKET sockets, on a veth pair
# in namespaces the script makes and removes (bench/hostdev), TX and RX, 64
# and 1514 bytes, A B A B; root; installs testpmd with apt when missing.
# About 30 minutes with the defaults; not part of make test. Settings through
# the environment, e.g. make bench-hostdev DUR=5 REPEAT=1 SIZES=64.
bench-hostdev: deps
	bash bench/hostdev/run.sh

# Every fuzz target for FUZZTIME each (their seed corpora run in make test).
FUZZTIME ?= 60s
fuzz: deps
	@for f in $$(grep -rl --include='*_test.go' '^func Fuzz' . | sort); do \
		pkg=./$$(dirname $${f#./}); \
		for t in $$(grep -o '^func Fuzz[A-Za-z0-9_]*' $$f | cut -d' ' -f2); do \
			echo "== $$pkg $$t ($(FUZZTIME))"; \
			$(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
		done; \
	done

# The soaks with random faults, for SOAKTIME each (short ones run in make
# test): the software device, and virtio's used rings driven in process
# (packed and split, read through Poll and through a CQ).
SOAKTIME ?= 60s
soak: deps
	VFNIC_SOAK=$(SOAKTIME) $(GO) test -count=1 -run '^TestSoak$$' -v ./tests/simcq
	VFNIC_SOAK=$(SOAKTIME) $(GO) test -count=1 -timeout 0 -run '^TestSoakUsedRing$$' -v ./nic/virtio

clean:
	$(GO) clean -testcache
