/*
 * ring.h: the shared-memory file that the benchmark producer writes and both
 * readers (reader.c and ../goreader) map. Keep it in step with the constants
 * in ../goreader/shm.go; the offsets are checked by _Static_assert here and
 * at run time by the Go reader (magic and version).
 *
 * File layout:
 *   [0, 4096)          control page (struct vb_ctrl)
 *   [4096, 4096+N*64)  ring of N 64-byte completion entries (struct vb_cqe)
 *
 * The entry is cq/qpsim's CQE, little-endian; the owner word at 60 holds the
 * phase bit (bit 31), NVMe style: phase 1 on the first lap, flipping each
 * lap, stored last with a release store.
 *
 * Other ring layouts (the header's layout word), the formats a virtio NIC
 * writes, each after the same control page:
 *   VB_LAYOUT_PACKED  N 16-byte virtio packed-ring descriptors (struct
 *                     vb_desc): the device writes id and len, then the
 *                     flags with AVAIL (bit 7) and USED (bit 15) both equal
 *                     to the wrap counter (1 on the first lap), last, with
 *                     a release store.
 *   VB_LAYOUT_SPLIT   a virtio split used ring: flags u16, idx u16, then N
 *                     8-byte elements {id u32, len u32} (struct vb_used);
 *                     the device writes elements, then the free-running
 *                     16-bit idx with a release store.
 *   VB_LAYOUT_IGB     N 16-byte Intel 82576 advanced receive descriptors
 *                     in write-back form (struct vb_igb_wb): the device
 *                     writes the RSS/packet-info quadword and the length,
 *                     then the status word with DD|EOP last, with a
 *                     release store; the position is the id.
 * None carries data: sequence s is told by its id (s % N) and length.
 */
#ifndef VFNIC_BENCH_RING_H
#define VFNIC_BENCH_RING_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define VB_MAGIC 0x51434656u /* "VFCQ" */
#define VB_VERSION 2u
#define VB_CTRL_SIZE 4096u
#define VB_ENTRY_SIZE 64u
#define VB_OWNER_BIT 0x80000000u

/* Ring layouts (header word layout). */
#define VB_LAYOUT_SIM 0u    /* cq/qpsim's 64-byte CQE, phase bit */
#define VB_LAYOUT_PACKED 1u /* virtio packed ring, 16-byte descriptors */
#define VB_LAYOUT_SPLIT 2u  /* virtio split used ring, 8-byte elements after a 4-byte header */
#define VB_LAYOUT_IGB 3u    /* igb receive write-back descriptors, DD bit */
#define VB_LAYOUTS 4u
#define VB_PACKED_AVAIL 0x80u
#define VB_PACKED_USED 0x8000u

/* Modes written in the header by the producer. */
#define VB_MODE_FILLED 1u /* one whole lap at a time, then wait until read */
#define VB_MODE_STREAM 2u /* as fast as the reader frees slots */
#define VB_MODE_LOCAL 3u  /* no producer: the reader fills each lap itself */

/* The producer never has more than entries - VB_SLACK completions
 * unconsumed, so it never completes an id the reader has consumed but not
 * yet re-posted (the consumer index is published before the re-posts).
 * Readers refuse batches above it. */
#define VB_SLACK 256u

/* cq/qpsim's opcodes, statuses and dev_flags bits. */
enum { VB_OP_SEND = 0, VB_OP_RECV = 1, VB_OP_WRITE = 2, VB_OP_READ = 3, VB_OP_RECV_RDMA_IMM = 4 };
enum {
	VB_ST_OK = 0,
	VB_ST_LOCAL_LEN_ERR = 1,
	VB_ST_LOCAL_PROT_ERR = 2,
	VB_ST_WR_FLUSH_ERR = 3,
	VB_ST_REMOTE_ACCESS_ERR = 4,
	VB_ST_GENERAL_ERR = 5
};
enum { VB_DEV_HAS_DATA = 1, VB_DEV_TAGGED = 2, VB_DEV_MULTI_RECV = 4, VB_DEV_MORE = 8, VB_DEV_HAS_SRC = 16 };

/* The completions the producer writes, so readers and the Go test can
 * check every field: sequence number s completes id s % entries (the
 * readers post ids 0..N-1 and re-post in completion order), opcode RECV,
 * status OK, HAS_DATA with data = s, byte_len = VB_LEN(s). */
#define VB_POST_LEN 2048u
#define VB_LEN(s) (64u + (uint32_t)((s) & 1023u))
#define VB_BUF_BASE 0x10000000ull /* fake buffer addresses: no payload moves */

struct vb_cqe {
	uint32_t id;        /* 0 */
	uint16_t queue;     /* 4 */
	uint8_t opcode;     /* 6 */
	uint8_t status;     /* 7 */
	uint32_t byte_len;  /* 8 */
	uint32_t dev_flags; /* 12 */
	uint64_t data;      /* 16 */
	uint64_t tag;       /* 24 */
	uint64_t src;       /* 32 */
	uint32_t syndrome;  /* 40 */
	uint32_t buf_off;   /* 44 */
	uint8_t reserved[12];
	_Atomic uint32_t owner; /* 60: phase bit 31, written last */
};

/* struct vb_desc is a virtio packed-ring descriptor as the device writes a
 * used one. */
struct vb_desc {
	uint64_t addr;          /* 0: not written for a used descriptor */
	uint32_t len;           /* 8 */
	uint16_t id;            /* 12 */
	_Atomic uint16_t flags; /* 14: AVAIL and USED = wrap counter, last */
};

/* struct vb_igb_wb is an 82576 advanced receive descriptor as the device
 * writes it back (datasheet 7.1.5.2): status DD bit 0, EOP bit 1, RXE bit
 * 31 (the top bit of the error byte). */
struct vb_igb_wb {
	uint64_t info;            /* 0: RSS hash, packet type */
	_Atomic uint32_t status;  /* 8: status and errors, DD written last */
	uint16_t len;             /* 12 */
	uint16_t vlan;            /* 14 */
};
#define VB_IGB_DD 1u
#define VB_IGB_EOP 2u
#define VB_IGB_RXE 0x80000000u

/* struct vb_used is a virtio split used ring's header; its N elements
 * follow it. */
struct vb_used_elem {
	uint32_t id;
	uint32_t len;
};
struct vb_used {
	uint16_t flags;
	_Atomic uint16_t idx; /* free-running count of elements written */
	struct vb_used_elem ring[];
};

/* Each side's words sit on their own cache line, so that a reader spinning
 * on one does not steal the line the other side is writing. */
struct vb_ctrl {
	/* line 0, as cq/qpsim's CQ status page: the consumer doorbell (entries
	 * consumed, modulo 2^32) written by the reader once per batch; the
	 * overrun word (bit 0) the producer would set; the producer index. */
	_Atomic uint32_t consumer; /* 0 */
	uint32_t pad0[3];
	_Atomic uint32_t overrun;  /* 16 */
	_Atomic uint32_t producer; /* 20 */
	uint8_t pad1[40];
	/* line 1: header, complete before the file appears under its name */
	uint32_t magic;      /* 64 */
	uint32_t version;    /* 68 */
	uint32_t entries;    /* 72 */
	uint32_t entry_size; /* 76 */
	uint32_t mode;       /* 80 */
	uint32_t slack;      /* 84 */
	uint64_t total;      /* 88: completions the producer will write */
	uint32_t layout;     /* 96: VB_LAYOUT_* */
	uint8_t pad2[28];
	/* line 2: reader -> producer, set once the reader has posted its ops */
	_Atomic uint32_t reader_ready; /* 128 */
	uint8_t pad3[60];
	/* line 3: producer -> reader: completions written (filled mode: after
	 * each lap; stream mode: at the end) */
	_Atomic uint64_t produced; /* 192 */
	uint8_t pad4[56];
	/* line 4: reader -> producer (filled mode): laps read and re-posted */
	_Atomic uint32_t laps_done; /* 256 */
	uint8_t pad5[60];
	/* line 5: either side sets it when it gives up, so the other stops */
	_Atomic uint32_t abort_flag; /* 320 */
};

_Static_assert(sizeof(struct vb_cqe) == VB_ENTRY_SIZE, "entry size");
_Static_assert(sizeof(struct vb_desc) == 16 && offsetof(struct vb_desc, flags) == 14, "packed descriptor");
_Static_assert(sizeof(struct vb_igb_wb) == 16 && offsetof(struct vb_igb_wb, len) == 12, "igb write-back");
_Static_assert(sizeof(struct vb_used) == 4 && offsetof(struct vb_used, ring) == 4, "split used ring");
_Static_assert(offsetof(struct vb_ctrl, layout) == 96, "layout offset");
_Static_assert(offsetof(struct vb_cqe, data) == 16, "data offset");
_Static_assert(offsetof(struct vb_cqe, buf_off) == 44, "buf_off offset");
_Static_assert(offsetof(struct vb_cqe, owner) == 60, "owner offset");
_Static_assert(offsetof(struct vb_ctrl, overrun) == 16, "overrun offset");
_Static_assert(offsetof(struct vb_ctrl, magic) == 64, "magic offset");
_Static_assert(offsetof(struct vb_ctrl, total) == 88, "total offset");
_Static_assert(offsetof(struct vb_ctrl, reader_ready) == 128, "reader_ready offset");
_Static_assert(offsetof(struct vb_ctrl, produced) == 192, "produced offset");
_Static_assert(offsetof(struct vb_ctrl, laps_done) == 256, "laps_done offset");
_Static_assert(offsetof(struct vb_ctrl, abort_flag) == 320, "abort offset");
_Static_assert(sizeof(struct vb_ctrl) <= VB_CTRL_SIZE, "control page");
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the ring is little-endian; this benchmark supports little-endian hosts only"
#endif

/* vb_entries_ok reports whether a ring of n entries is one the producer and
 * local mode make: a power of two in [2 * VB_SLACK, 2^24]. */
static inline int vb_entries_ok(uint32_t n)
{
	return n >= 2 * VB_SLACK && n <= (1u << 24) && (n & (n - 1)) == 0;
}

/* vb_entry_size is the size of one entry of layout (0: no such layout). */
static inline uint32_t vb_entry_size(uint32_t layout)
{
	switch (layout) {
	case VB_LAYOUT_SIM:
		return VB_ENTRY_SIZE;
	case VB_LAYOUT_PACKED:
		return sizeof(struct vb_desc);
	case VB_LAYOUT_SPLIT:
		return sizeof(struct vb_used_elem);
	case VB_LAYOUT_IGB:
		return sizeof(struct vb_igb_wb);
	}
	return 0;
}

/* vb_ring_size is the size of the ring after the control page. */
static inline size_t vb_ring_size(uint32_t layout, uint32_t n)
{
	return (layout == VB_LAYOUT_SPLIT ? sizeof(struct vb_used) : 0) + (size_t)n * vb_entry_size(layout);
}

/* vb_layout_names are the layouts' names, by VB_LAYOUT_* value. */
static const char *const vb_layout_names[VB_LAYOUTS] = {"sim", "packed", "split", "igb"};

/* vb_parse_layout returns the layout named s, or -1. */
static inline int vb_parse_layout(const char *s)
{
	for (unsigned i = 0; i < VB_LAYOUTS; i++) {
		const char *a = vb_layout_names[i], *b = s;
		while (*a && *a == *b)
			a++, b++;
		if (!*a && !*b)
			return (int)i;
	}
	return -1;
}

/* vb_init_header writes the header of a new ring (line 1 of vb_ctrl). */
static inline void vb_init_header(struct vb_ctrl *c, uint32_t n, uint32_t mode, uint64_t total, uint32_t layout)
{
	c->magic = VB_MAGIC;
	c->version = VB_VERSION;
	c->entries = n;
	c->layout = layout;
	c->entry_size = vb_entry_size(layout);
	c->mode = mode;
	c->slack = VB_SLACK;
	c->total = total;
}

/* vb_fill writes every field of the entry for sequence s but its owner
 * word: id s % n, opcode RECV, status OK, HAS_DATA, data s, VB_LEN(s). */
static inline void vb_fill(struct vb_cqe *ring, uint64_t s, uint32_t n)
{
	struct vb_cqe *e = &ring[s & (n - 1)];
	e->id = (uint32_t)(s & (n - 1));
	e->queue = 0;
	e->opcode = VB_OP_RECV;
	e->status = VB_ST_OK;
	e->byte_len = VB_LEN(s);
	e->dev_flags = VB_DEV_HAS_DATA;
	e->data = s;
	e->tag = 0;
	e->src = 0;
	e->syndrome = 0;
	e->buf_off = 0;
	for (unsigned i = 0; i < sizeof e->reserved; i++)
		e->reserved[i] = 0;
}

/* vb_publish hands the entry for sequence s to the reader: the owner word
 * with this lap's phase (1 on lap 0, flipping each lap; shift = log2 n),
 * stored last with release semantics. */
static inline void vb_publish(struct vb_cqe *ring, uint64_t s, uint32_t n, unsigned shift)
{
	uint32_t phase = 1u ^ ((uint32_t)(s >> shift) & 1u);
	atomic_store_explicit(&ring[s & (n - 1)].owner, phase << 31, memory_order_release);
}

/* vb_put writes the entries for sequences [s, s+k): their fields, then
 * their owner words in order, like a device that writes a burst of
 * completions. */
static inline void vb_put(struct vb_cqe *ring, uint64_t s, uint32_t k, uint32_t n, unsigned shift)
{
	for (uint32_t j = 0; j < k; j++)
		vb_fill(ring, s + j, n);
	for (uint32_t j = 0; j < k; j++)
		vb_publish(ring, s + j, n, shift);
}

/* vb_put_packed is vb_put for the packed layout: id and len of each
 * descriptor of the burst, then their flags in order, release. */
static inline void vb_put_packed(struct vb_desc *ring, uint64_t s, uint32_t k, uint32_t n, unsigned shift)
{
	for (uint32_t j = 0; j < k; j++) {
		struct vb_desc *d = &ring[(s + j) & (n - 1)];
		d->id = (uint16_t)((s + j) & (n - 1));
		d->len = VB_LEN(s + j);
	}
	for (uint32_t j = 0; j < k; j++) {
		uint16_t wrap = (uint16_t)(1u ^ ((uint32_t)((s + j) >> shift) & 1u));
		atomic_store_explicit(&ring[(s + j) & (n - 1)].flags, wrap ? VB_PACKED_AVAIL | VB_PACKED_USED : 0,
				      memory_order_release);
	}
}

/* vb_put_split is vb_put for the split used ring: the burst's elements,
 * then the used index once, release. */
static inline void vb_put_split(struct vb_used *u, uint64_t s, uint32_t k, uint32_t n)
{
	for (uint32_t j = 0; j < k; j++) {
		struct vb_used_elem *e = &u->ring[(s + j) & (n - 1)];
		e->id = (uint32_t)((s + j) & (n - 1));
		e->len = VB_LEN(s + j);
	}
	atomic_store_explicit(&u->idx, (uint16_t)(s + k), memory_order_release);
}

/* vb_put_igb is vb_put for igb's write-back descriptors: the burst's
 * packet-info quadwords and lengths, then their status words (DD|EOP) in
 * order, release. */
static inline void vb_put_igb(struct vb_igb_wb *ring, uint64_t s, uint32_t k, uint32_t n)
{
	for (uint32_t j = 0; j < k; j++) {
		struct vb_igb_wb *d = &ring[(s + j) & (n - 1)];
		d->info = s + j;
		d->len = (uint16_t)VB_LEN(s + j);
		d->vlan = 0;
	}
	for (uint32_t j = 0; j < k; j++)
		atomic_store_explicit(&ring[(s + j) & (n - 1)].status, VB_IGB_DD | VB_IGB_EOP, memory_order_release);
}

/* vb_put_any is vb_put for any layout; ring is the memory after the
 * control page. */
static inline void vb_put_any(void *ring, uint32_t layout, uint64_t s, uint32_t k, uint32_t n, unsigned shift)
{
	switch (layout) {
	case VB_LAYOUT_PACKED:
		vb_put_packed(ring, s, k, n, shift);
		break;
	case VB_LAYOUT_SPLIT:
		vb_put_split(ring, s, k, n);
		break;
	case VB_LAYOUT_IGB:
		vb_put_igb(ring, s, k, n);
		break;
	default:
		vb_put(ring, s, k, n, shift);
	}
}

/* vb_now_s is the monotonic clock in seconds. */
static inline double vb_now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline void vb_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

#endif
