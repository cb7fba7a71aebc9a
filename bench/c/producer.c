/*
 * producer: the "device" of the completion-path benchmark. It creates the
 * shared-memory file described in ring.h and writes completions into it the
 * way a NIC writes them into DMA memory: every field of the entry, then the
 * owner word with the phase bit, last, with a release store. It never
 * overwrites an entry the reader has not consumed: it reads the consumer
 * doorbell (the count of consumed entries) the reader writes once per
 * batch, and only when the ring looks full.
 *
 * Modes:
 *   filled  write one whole lap (N entries) and stop until the reader says
 *           it has read and re-posted it (laps_done); -c picks the number
 *           of laps (count rounded up to a multiple of N, default one lap).
 *           The reader times only its reads of a full ring: the state a
 *           NIC leaves after a burst.
 *   stream  write -c completions as fast as the reader frees slots, keeping
 *           at most N - VB_SLACK unconsumed (end to end).
 *
 * Sequence number s completes id s % N: opcode RECV, status OK, HAS_DATA
 * with data = s, byte_len = VB_LEN(s) (<= the posted VB_POST_LEN).
 *
 * Completions are written in bursts of -b entries (default 16, and at most
 * what the reader has freed): the fields of the whole burst, then its owner
 * words in order. The reader spins on the first unwritten entry; writing a
 * burst's fields first keeps it from pulling that line back between the
 * producer's stores to it.
 *
 * -L picks the ring layout (ring.h): sim (default, cq/qpsim's CQE), packed
 * (virtio packed ring), split (virtio split used ring) or igb (82576
 * receive write-back descriptors).
 *
 * Usage: producer -f PATH -n ENTRIES -m filled|stream [-L LAYOUT] [-c COUNT] [-b BURST] [-t SECONDS]
 * The file is created as PATH.tmp and renamed to PATH once initialised, so
 * a reader never maps a half-made file; it is unlinked on exit. Prints one
 * line of statistics on stdout.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "ring.h"

static const char *path;
static struct vb_ctrl *ctrl;
static double timeout_s = 20;

static void fail(const char *what)
{
	fprintf(stderr, "producer: %s\n", what);
	if (ctrl)
		atomic_store_explicit(&ctrl->abort_flag, 1, memory_order_release);
	if (path)
		unlink(path);
	exit(1);
}

/* waiter bounds a spin: it checks the clock and the abort flag every few
 * thousand spins, so that a reader that died does not leave us spinning. */
struct waiter {
	double deadline;
	unsigned spins;
};

static void waiter_start(struct waiter *w)
{
	w->deadline = vb_now_s() + timeout_s;
	w->spins = 0;
}

static void waiter_spin(struct waiter *w, const char *what)
{
	vb_pause();
	if ((++w->spins & 4095) != 0)
		return;
	if (atomic_load_explicit(&ctrl->abort_flag, memory_order_acquire))
		fail("the reader gave up");
	if (vb_now_s() > w->deadline) {
		char msg[160];
		snprintf(msg, sizeof msg, "timed out after %.0f s waiting for %s", timeout_s, what);
		fail(msg);
	}
}

static void usage(void)
{
	fprintf(stderr, "usage: producer -f PATH -n ENTRIES -m filled|stream [-L sim|packed|split|igb] [-c COUNT] [-b BURST] "
			"[-t SECONDS]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	uint32_t n = 4096;
	uint64_t count = 0;
	uint32_t mode = 0;
	uint32_t burst = 16;
	int layout = VB_LAYOUT_SIM;
	int c;
	while ((c = getopt(argc, argv, "f:n:m:c:b:t:L:")) != -1) {
		switch (c) {
		case 'L':
			layout = vb_parse_layout(optarg);
			if (layout < 0)
				usage();
			break;
		case 'f':
			path = optarg;
			break;
		case 'n':
			n = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case 'm':
			if (strcmp(optarg, "filled") == 0)
				mode = VB_MODE_FILLED;
			else if (strcmp(optarg, "stream") == 0)
				mode = VB_MODE_STREAM;
			else
				usage();
			break;
		case 'c':
			count = strtoull(optarg, NULL, 0);
			break;
		case 'b':
			burst = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case 't':
			timeout_s = strtod(optarg, NULL);
			break;
		default:
			usage();
		}
	}
	if (!path || !mode)
		usage();
	if (!vb_entries_ok(n)) {
		fprintf(stderr, "producer: %u entries: need a power of two in [%u, 2^24]\n", n, 2 * VB_SLACK);
		return 2;
	}
	if (burst < 1 || burst > VB_SLACK || (burst & (burst - 1)) != 0) {
		fprintf(stderr, "producer: burst %u: need a power of two in [1, %u]\n", burst, VB_SLACK);
		return 2;
	}
	unsigned shift = (unsigned)__builtin_ctz(n);
	if (count == 0)
		count = n;
	if (mode == VB_MODE_FILLED)
		count = (count + n - 1) / n * n;

	if (layout != VB_LAYOUT_SIM && n > 1u << 15) {
		fprintf(stderr, "producer: %u entries: a virtio ring has at most 32768\n", n);
		return 2;
	}
	size_t size = VB_CTRL_SIZE + vb_ring_size((uint32_t)layout, n);
	char tmp[4096];
	if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
		fail("path too long");
	int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0) {
		perror(tmp);
		return 1;
	}
	if (ftruncate(fd, (off_t)size) != 0) {
		perror("ftruncate");
		unlink(tmp);
		return 1;
	}
	void *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (mem == MAP_FAILED) {
		perror("mmap");
		unlink(tmp);
		return 1;
	}
	/* A new file reads as zeros: every owner bit is 0, so no entry looks
	 * written on the first lap, whose phase is 1. */
	ctrl = mem;
	void *ring = (char *)mem + VB_CTRL_SIZE;
	vb_init_header(ctrl, n, mode, count, (uint32_t)layout);
	atomic_thread_fence(memory_order_seq_cst);
	if (rename(tmp, path) != 0) {
		perror("rename");
		unlink(tmp);
		return 1;
	}

	struct waiter w;
	waiter_start(&w);
	while (!atomic_load_explicit(&ctrl->reader_ready, memory_order_acquire))
		waiter_spin(&w, "the reader to attach");

	double t0 = vb_now_s();
	uint64_t waits = 0; /* stream: times the ring was full and we waited */
	if (mode == VB_MODE_STREAM) {
		uint64_t window = n - VB_SLACK;
		uint64_t cons = 0; /* last consumer count seen, widened to 64 bits */
		for (uint64_t s = 0; s < count;) {
			if (s - cons >= window) {
				waits++;
				waiter_start(&w);
				for (;;) {
					uint32_t c32 = atomic_load_explicit(&ctrl->consumer, memory_order_acquire);
					uint32_t behind = (uint32_t)s - c32;
					if (behind > n)
						fail("consumer doorbell ahead of the producer");
					cons = s - behind;
					if (s - cons < window)
						break;
					waiter_spin(&w, "the consumer index");
				}
			}
			uint64_t k = window - (s - cons);
			if (k > burst)
				k = burst;
			if (k > count - s)
				k = count - s;
			vb_put_any(ring, (uint32_t)layout, s, (uint32_t)k, n, shift);
			s += k;
		}
	} else {
		uint32_t laps = (uint32_t)(count / n);
		for (uint32_t lap = 0; lap < laps; lap++) {
			waiter_start(&w);
			while (atomic_load_explicit(&ctrl->laps_done, memory_order_acquire) != lap)
				waiter_spin(&w, "the reader to finish a lap");
			uint32_t c32 = atomic_load_explicit(&ctrl->consumer, memory_order_acquire);
			if (c32 != (uint32_t)((uint64_t)lap * n))
				fail("reader finished a lap without publishing its consumer index");
			for (uint64_t s = (uint64_t)lap * n; s < (uint64_t)(lap + 1) * n; s += burst)
				vb_put_any(ring, (uint32_t)layout, s, burst, n, shift);
			atomic_store_explicit(&ctrl->produced, (uint64_t)(lap + 1) * n, memory_order_release);
		}
	}
	double el = vb_now_s() - t0;
	atomic_store_explicit(&ctrl->producer, (uint32_t)count, memory_order_relaxed);
	atomic_store_explicit(&ctrl->produced, count, memory_order_release);
	printf("producer layout=%s mode=%s entries=%u completions=%" PRIu64 " full_waits=%" PRIu64 " ns_per_completion=%.3f\n",
	       vb_layout_names[layout], mode == VB_MODE_STREAM ? "stream" : "filled", n, count, waits, el * 1e9 / (double)count);
	/* The reader attached (reader_ready) before we wrote anything, so it
	 * holds its own mapping: the name can go now. */
	unlink(path);
	return 0;
}
