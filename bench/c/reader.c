/*
 * reader: the C reference for vfnic's completion path. It maps the file the
 * producer writes (ring.h) and does, per completion, the work that
 * cq.CQ.Read does over cq/qpsim's ring (cq.RingSource.poll) followed by the
 * re-post through cq.Table.Post that goreader does:
 *
 *   - acquire load of the owner word, phase compare (stop at the first
 *     entry not yet written); the expected phase flips on wrap;
 *   - read the fields; look up the queue's table; validate the id (slot
 *     index < N, slot outstanding, full id equal to the posted one), the
 *     status and opcode (known, via 256-entry tables as the Go code does),
 *     byte_len <= posted length and buf_off within the buffer;
 *   - convert into a struct fi_cq_data_entry (op_context, flags = posted
 *     flags | opcode flags | dev_flags bits, len, buf = posted buffer +
 *     buf_off for receives, data when REMOTE_CQ_DATA), release the slot to
 *     the table's free queue;
 *   - when the batch stops at an unwritten entry: the hole check (is the
 *     next entry written while the head is not?) and the overrun word;
 *   - once per batch: the consumer-count doorbell (store fence, then the
 *     store, skipped when unchanged, as vfnic's doorbell package does) and
 *     the release store that hands the freed ids back to posters;
 *   - a mutex around each read (cq.CQ is thread-safe by default) and one
 *     around each post (cq.Table.Post serialises posters);
 *   - the caller then checks data == sequence number and re-posts the
 *     buffer (post: take a free id, bump its generation, fill the slot,
 *     release-store its state): at once in stream mode; after the timed
 *     reads of each lap in filled and local mode, which time the read path
 *     alone (goreader does the same).
 *
 * What it does differently from the Go path (also printed by run.sh):
 *   - an entry that fails a check is reported and the run stops; the Go
 *     path stages it as an error completion (ReadErr, StrError), which the
 *     benchmark never exercises;
 *   - fields are read through a C struct, not through cq.Layout's
 *     declarative (offset, shift, mask) fields;
 *   - the output is the 40-byte fi_cq_data_entry; cq.Entry is 64 bytes
 *     (Context is an interface, and it has Tag and Queue); the tag is not
 *     converted (FormatData masks it to 0 in Go too);
 *   - none in the release stores: plain stores on x86, as Go's
 *     (cq/ring's storeRelease32: slot state in Post, free-queue tail once
 *     per batch);
 *   - no source addresses (ReadFrom) and no multi-source CQ loop.
 *
 * -D (layouts packed, split, igb) is the driver work, the like-for-like
 * reference for the drivers' Poll (bench/run.sh's driver rows): on the
 * same ring reader as cq_read_packed, cq_read_split and cq_read_igb, what
 * nic/virtio's or nic/igb's pass and nic/internal/queue's Poll do per
 * completion (drv_take: the queue's counts; virtio-net's length and
 * num_buffers from the header in the buffer, or igb's length and its
 * write-back words kept per buffer; the buffer lent; a record with
 * nic.Completion's fields) and per batch (read_end: the interrupt
 * disarmed if armed, the atomic packet and byte counters), in buffers of
 * real memory, whose virtio-net headers it writes itself (the producer,
 * another process, writes none): once at setup, and in local mode again
 * in each lap's untimed fill. Run it with -T, since Go's sync.Mutex
 * always locks. drv_poll_* is what bench/callgrind.sh counts.
 *
 * Usage: reader -f PATH -b BATCH [-D] [-k] [-T] [-t SECONDS]
 *        reader -l [-L LAYOUT] [-n ENTRIES] [-c COUNT] -b BATCH [-D] [-k] [-T]
 * -l is local mode: no producer; the reader writes each lap itself (the
 * producer's code, untimed) and times its reads of the full ring, with the
 * entries hot in its own cache: the CPU cost of the read path alone.
 * -k computes a digest of every converted field (for the Go test). Prints
 * one line: reader=c work=ring|driver mode=... batch=... ns_per_completion=...
 * order=ok ...
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ring.h"

/* libfabric's completion flags (the values cq.Flags uses). */
#define FI_MSG (1ull << 1)
#define FI_RMA (1ull << 2)
#define FI_TAGGED (1ull << 3)
#define FI_READ (1ull << 8)
#define FI_WRITE (1ull << 9)
#define FI_RECV (1ull << 10)
#define FI_SEND (1ull << 11)
#define FI_REMOTE_WRITE (1ull << 13)
#define FI_MULTI_RECV (1ull << 16)
#define FI_REMOTE_CQ_DATA (1ull << 17)
#define FI_MORE (1ull << 18)

/* struct fi_cq_data_entry */
struct cq_data_entry {
	void *op_context;
	uint64_t flags;
	size_t len;
	void *buf;
	uint64_t data;
};

/* ---- posted operations (cq.Table) ---- */

struct op {
	void *ctx;
	uintptr_t buf;
	size_t len;
	uint64_t flags;
	uint64_t word; /* the driver's word (cq/ring's Op.Word) */
};

enum { SLOT_FREE = 0, SLOT_POSTED = 1 };

struct slot {
	_Atomic uint32_t state;
	uint32_t id; /* slot index | generation << slot_bits */
	uint32_t len;
	bool multi;
	uint64_t flags;
	uintptr_t buf;
	void *ctx;
};

struct table {
	struct slot *slots;
	uint32_t n, slot_mask, id_mask, qmask;
	unsigned slot_bits;
	uint32_t *freeq;
	/* the driver word of each slot, beside the slots as cq.Table keeps
	 * them (Table.words): read only by the driver variant */
	uint64_t *words;
	/* posters, shared, completer: separate lines, as in cq.Table */
	_Alignas(64) pthread_mutex_t mu;
	uint32_t fhead;
	_Alignas(64) _Atomic uint32_t ftail;
	_Alignas(64) uint32_t ftail_local;
	bool dirty;
};

static int table_init(struct table *t, uint32_t n, unsigned id_bits)
{
	unsigned sb = n > 1 ? 32u - (unsigned)__builtin_clz(n - 1) : 0;
	if (id_bits < sb || id_bits > 32)
		return -EINVAL;
	uint32_t qn = 1u << sb;
	memset(t, 0, sizeof *t);
	t->slots = calloc(n, sizeof *t->slots);
	t->freeq = calloc(qn, sizeof *t->freeq);
	t->words = calloc(qn, sizeof *t->words);
	if (!t->slots || !t->freeq || !t->words)
		return -ENOMEM;
	t->n = n;
	t->slot_bits = sb;
	t->slot_mask = (uint32_t)((1ull << sb) - 1);
	t->id_mask = (uint32_t)((1ull << id_bits) - 1);
	t->qmask = qn - 1;
	pthread_mutex_init(&t->mu, NULL);
	for (uint32_t i = 0; i < n; i++) {
		t->slots[i].id = i;
		t->freeq[i] = i;
	}
	atomic_init(&t->ftail, n);
	t->ftail_local = n;
	return 0;
}

/* table_post records op and returns its id, or -1 when every slot is
 * outstanding. */
static int64_t table_post(struct table *t, const struct op *op)
{
	if (op->len > UINT32_MAX)
		return -1;
	pthread_mutex_lock(&t->mu);
	if (t->fhead == atomic_load_explicit(&t->ftail, memory_order_acquire)) {
		pthread_mutex_unlock(&t->mu);
		return -1;
	}
	uint32_t i = t->freeq[t->fhead & t->qmask];
	t->fhead++;
	struct slot *s = &t->slots[i];
	uint32_t gen = (s->id >> t->slot_bits) + 1;
	s->id = ((gen << t->slot_bits) | i) & t->id_mask;
	s->len = (uint32_t)op->len;
	s->multi = (op->flags & FI_MULTI_RECV) != 0;
	s->flags = op->flags & ~FI_MULTI_RECV;
	s->buf = op->buf;
	s->ctx = op->ctx;
	t->words[i] = op->word;
	atomic_store_explicit(&s->state, SLOT_POSTED, memory_order_release);
	uint32_t id = s->id;
	pthread_mutex_unlock(&t->mu);
	return id;
}

static inline struct slot *table_lookup(struct table *t, uint32_t id)
{
	uint32_t i = id & t->slot_mask;
	if (i >= t->n)
		return NULL;
	struct slot *s = &t->slots[i];
	if (atomic_load_explicit(&s->state, memory_order_acquire) != SLOT_POSTED || s->id != id)
		return NULL;
	return s;
}

static inline void table_release(struct table *t, struct slot *s, uint32_t id)
{
	s->ctx = NULL;
	atomic_store_explicit(&s->state, SLOT_FREE, memory_order_relaxed);
	t->freeq[t->ftail_local & t->qmask] = id & t->slot_mask;
	t->ftail_local++;
}

static inline void table_flush(struct table *t)
{
	atomic_store_explicit(&t->ftail, t->ftail_local, memory_order_release);
	t->dirty = false;
}

/* ---- the completion queue over one ring (cq.Ring + cq.RingSource + cq.CQ) ---- */

struct status_code {
	int err;
	bool known;
};
struct op_code {
	uint64_t flags;
	bool known;
};

#define MAX_DIRTY 16

struct cq {
	pthread_mutex_t mu;
	uint32_t layout;       /* VB_LAYOUT_* */
	struct vb_desc *descs; /* VB_LAYOUT_PACKED */
	struct vb_used *used;  /* VB_LAYOUT_SPLIT */
	struct vb_igb_wb *igb; /* VB_LAYOUT_IGB */
	uint64_t (*meta)[2];   /* VB_LAYOUT_IGB: the write-back words per buffer, as nic/igb keeps them */
	struct rxq *rx;        /* the driver variant's receive queue (-D) */
	struct vb_cqe *base;
	struct vb_ctrl *ctrl;
	uint32_t n;
	uint32_t head, want, count;
	struct table **tabs;
	uint32_t ntabs;
	struct status_code stat[256];
	struct op_code op[256];
	uint64_t bits[256];
	struct table *dirty[MAX_DIRTY];
	int ndirty;
	uint32_t db_last;
	bool db_valid;
	bool staged, overrun;
	const char *why; /* the failed check, for the message */
};

static void cq_init(struct cq *q, struct vb_ctrl *ctrl, void *ring, uint32_t layout, uint32_t n, struct table **tabs,
		    uint32_t ntabs)
{
	memset(q, 0, sizeof *q);
	pthread_mutex_init(&q->mu, NULL);
	q->ctrl = ctrl;
	q->layout = layout;
	q->base = ring;
	q->descs = ring;
	q->used = ring;
	q->igb = ring;
	q->n = n;
	q->want = VB_OWNER_BIT; /* phase 1 on the first lap */
	q->tabs = tabs;
	q->ntabs = ntabs;
	/* cq/qpsim's codes (sim.Codes) */
	q->stat[VB_ST_OK] = (struct status_code){0, true};
	q->stat[VB_ST_LOCAL_LEN_ERR] = (struct status_code){265 /* FI_ETRUNC */, true};
	q->stat[VB_ST_LOCAL_PROT_ERR] = (struct status_code){EFAULT, true};
	q->stat[VB_ST_WR_FLUSH_ERR] = (struct status_code){ECANCELED, true};
	q->stat[VB_ST_REMOTE_ACCESS_ERR] = (struct status_code){EACCES, true};
	q->stat[VB_ST_GENERAL_ERR] = (struct status_code){EIO, true};
	q->op[VB_OP_SEND] = (struct op_code){FI_SEND, true};
	q->op[VB_OP_RECV] = (struct op_code){FI_RECV, true};
	q->op[VB_OP_WRITE] = (struct op_code){FI_RMA | FI_WRITE, true};
	q->op[VB_OP_READ] = (struct op_code){FI_RMA | FI_READ, true};
	q->op[VB_OP_RECV_RDMA_IMM] = (struct op_code){FI_RMA | FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA, true};
	static const uint64_t flag_bits[8] = {FI_REMOTE_CQ_DATA, FI_TAGGED, FI_MULTI_RECV, FI_MORE};
	for (int v = 0; v < 256; v++)
		for (int b = 0; b < 8; b++)
			if (v & (1 << b))
				q->bits[v] |= flag_bits[b];
}

static inline bool ready_at(struct cq *q, uint32_t i, uint32_t want)
{
	return (atomic_load_explicit(&q->base[i].owner, memory_order_acquire) & VB_OWNER_BIT) == want;
}

static inline void doorbell_ring(struct cq *q, uint32_t v)
{
	if (q->db_valid && v == q->db_last)
		return;
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_sfence();
#endif
	atomic_store_explicit(&q->ctrl->consumer, v, memory_order_release);
	q->db_last = v;
	q->db_valid = true;
}

static inline void mark_dirty(struct cq *q, struct table *t)
{
	if (q->ndirty == MAX_DIRTY) {
		table_flush(t);
		return;
	}
	t->dirty = true;
	q->dirty[q->ndirty++] = t;
}

/* cq_read moves up to count completions into ents. It returns the number
 * moved (0: empty), -EIO when a refused entry is at the head, -EOVERFLOW
 * once the ring overran and is drained. */
static int cq_read(struct cq *q, struct cq_data_entry *ents, int count)
{
	pthread_mutex_lock(&q->mu);
	if (q->staged || q->overrun) {
		pthread_mutex_unlock(&q->mu);
		return q->staged ? -EIO : -EOVERFLOW;
	}
	struct vb_cqe *base = q->base;
	uint32_t head = q->head, want = q->want, cnt = q->count, size = q->n;
	int n = 0;
	bool stopped = false, fail = false;
	while (n < count) {
		struct vb_cqe *e = &base[head];
		if ((atomic_load_explicit(&e->owner, memory_order_acquire) & VB_OWNER_BIT) != want) {
			stopped = true;
			break;
		}
		uint32_t id = e->id;
		uint32_t qn = e->queue;
		struct table *t = qn < q->ntabs ? q->tabs[qn] : NULL;
		if (!t) {
			q->why = "queue not bound";
			fail = true;
			break;
		}
		struct slot *s = table_lookup(t, id);
		if (!s) {
			q->why = "id not outstanding";
			fail = true;
			break;
		}
		uint32_t ln = e->byte_len, off = e->buf_off;
		struct status_code sc = q->stat[e->status];
		struct op_code oc = q->op[e->opcode];
		if (!sc.known || sc.err != 0 || !oc.known || ln > s->len || off > s->len - ln) {
			q->why = "bad status, opcode or length";
			fail = true;
			break;
		}
		uint64_t fl = s->flags | oc.flags | q->bits[e->dev_flags & 0xff];
		if (fl & FI_TAGGED)
			fl &= ~FI_MSG;
		uintptr_t buf = 0;
		if (fl & FI_RECV)
			buf = s->buf + off;
		uint64_t data = 0;
		if (fl & FI_REMOTE_CQ_DATA)
			data = e->data;
		struct cq_data_entry *ent = &ents[n];
		ent->op_context = s->ctx;
		ent->flags = fl;
		ent->len = ln;
		ent->buf = (void *)buf;
		ent->data = data;
		if (!s->multi || (fl & FI_MULTI_RECV)) {
			table_release(t, s, id);
			if (!t->dirty)
				mark_dirty(q, t);
		}
		head++;
		cnt++;
		if (head == size) {
			head = 0;
			want ^= VB_OWNER_BIT;
		}
		n++;
	}
	q->head = head;
	q->want = want;
	q->count = cnt;
	if (fail) {
		q->staged = true;
	} else if (stopped) {
		/* hole: the head is not written but the next entry is (checked
		 * again after, so an entry being written is not mistaken) */
		uint32_t ni = head + 1, nw = want;
		if (ni == size) {
			ni = 0;
			nw ^= VB_OWNER_BIT;
		}
		if (!ready_at(q, head, want) && ready_at(q, ni, nw) && !ready_at(q, head, want)) {
			q->why = "wrong phase (hole)";
			q->staged = true;
		} else if ((atomic_load_explicit(&q->ctrl->overrun, memory_order_relaxed) & 1) &&
			   !ready_at(q, head, want)) {
			q->overrun = true;
		}
	}
	doorbell_ring(q, cnt);
	for (int i = 0; i < q->ndirty; i++)
		table_flush(q->dirty[i]);
	q->ndirty = 0;
	int ret = n;
	if (n == 0 && q->staged)
		ret = -EIO;
	else if (n == 0 && q->overrun)
		ret = -EOVERFLOW;
	pthread_mutex_unlock(&q->mu);
	return ret;
}

/* ---- the ring readers of virtio's and igb's rings, and the driver work ----
 *
 * Each ring layout has one reader (read_packed, read_split, read_igb), which
 * both the plain ring reader (cq_read_*: a fi_cq_data_entry per completion)
 * and the driver variant (drv_poll_*: what a driver's Poll does) run; the
 * constant `work` picks the per-entry step (take_entry) and the per-batch
 * end (read_end). The readers and steps are always inlined, so that each
 * cq_read_* and drv_poll_* is one loop with its step in it, also in
 * bench/callgrind.sh's build without inlining, and a constant work leaves
 * no test of it behind. */

#define ALWAYS_INLINE static inline __attribute__((always_inline))

enum work {
	WORK_RING,   /* cq_read_*: the ring reader's record */
	WORK_DRIVER, /* drv_poll_*: the driver's checks, counts, lending, record */
};

/* virtio-net's header before each received frame (no offloads: 12 bytes,
 * num_buffers at byte 10, little-endian) and an Ethernet header, the least
 * a frame holds (nic.MinFrame). */
#define NET_HDR 12u
#define NET_HDR_NUM_BUFFERS 10u
#define ETH_HDR 14u

/* struct drv_completion has nic.Completion's fields: Context (one pointer
 * here; Go's interface is two words), Buf (the frame's address), Data (the
 * frame: pointer, length, capacity to the buffer's end), Len, Queue and
 * Err (NULL; Go's interface is two words): 64 bytes, where Go's is 80. */
struct drv_completion {
	void *ctx;
	uintptr_t buf;
	uint8_t *data;
	size_t data_len, data_cap;
	size_t len;
	intptr_t queue;
	const void *err;
};
_Static_assert(sizeof(struct drv_completion) == 64, "drv_completion");

/* struct rxq is a receive queue's driver state beside its ring reader
 * (struct cq): its buffers, which of them are lent to the caller, igb's
 * write-back words per buffer, the queue's counts and counters. */
struct rxq {
	uint8_t *mem;      /* buffer 0 */
	uintptr_t base;    /* its address, as the table records posted buffers */
	size_t stride;     /* bytes per buffer */
	uint64_t recip;    /* ceil(2^64 / stride): buf_of multiplies by it */
	uint32_t nbuf;
	bool *lent;           /* per buffer: lent to the caller */
	uint64_t (*meta)[2];  /* igb, per buffer: the write-back's two words */
	int ndescs, nbufs;    /* descriptors and buffers the device holds (igb: descriptors) */
	intptr_t qidx;        /* the queue's index, in each record */
	bool armed;           /* an interrupt armed: a read disarms it */
	/* per batch, as nic/internal/queue's Core.Count (atomic.Uint64) */
	_Alignas(64) _Atomic uint64_t packets, bytes;
};

/* buf_of is the buffer at address a inside it, an address the table
 * recorded at the post (not one the device wrote): it multiplies the
 * offset by the reciprocal of the stride and keeps the high word, as
 * nic/internal/rxbuf's Pool.Of does, where a division by a stride known
 * only at run time would take tens of cycles. Exact for offsets below
 * 2^64 / stride (rxq_init checks the whole area). The stride is a
 * power of two here, but a driver's is what the MTU makes it. */
ALWAYS_INLINE uint32_t buf_of(const struct rxq *r, uintptr_t a)
{
	return (uint32_t)(((unsigned __int128)(a - r->base) * r->recip) >> 64);
}

/* drv_take is the driver's work per good entry, as nic/virtio's and
 * nic/igb's pass over a batch and nic/internal/queue's Poll do it: the
 * queue's counts (virtio: the descriptors posted with the buffer, from the
 * slot's driver word, and the buffers; igb: the descriptors); virtio: the
 * length covers virtio-net's header and an Ethernet header, and the
 * header's num_buffers, read once, is 1; igb: the length covers an
 * Ethernet header (DD|EOP without RXE is the ring reader's test), the two
 * write-back words kept per buffer; then the buffer lent to the caller
 * and the record written. A refused entry stops the read (Go's driver
 * makes an error completion of it). */
ALWAYS_INLINE bool drv_take(struct cq *q, uint32_t layout, void *out, int i, const struct slot *s, uint32_t id,
			    uint32_t ln, uint64_t info, uint32_t st, uint64_t *bytes)
{
	struct rxq *r = q->rx;
	uintptr_t a = s->buf;
	uint32_t hdr;
	if (layout == VB_LAYOUT_IGB) {
		r->ndescs--;
		if (ln < ETH_HDR) {
			q->why = "frame shorter than an Ethernet header";
			return false;
		}
		hdr = 0;
	} else {
		struct table *t = q->tabs[0];
		r->ndescs -= (uint16_t)t->words[id & t->slot_mask];
		r->nbufs--;
		if (ln < NET_HDR + ETH_HDR) {
			q->why = "frame shorter than virtio-net's and an Ethernet header";
			return false;
		}
		const uint8_t *h = (const uint8_t *)a;
		uint16_t nb = (uint16_t)(h[NET_HDR_NUM_BUFFERS] | h[NET_HDR_NUM_BUFFERS + 1] << 8);
		if (nb != 1) {
			q->why = "num_buffers not 1";
			return false;
		}
		hdr = NET_HDR;
	}
	uint32_t b = buf_of(r, a);
	if (layout == VB_LAYOUT_IGB) {
		r->meta[b][0] = info;
		r->meta[b][1] = (uint64_t)st | (uint64_t)ln << 32;
	}
	r->lent[b] = true;
	size_t fl = ln - hdr;
	struct drv_completion *o = &((struct drv_completion *)out)[i];
	o->ctx = s->ctx;
	o->buf = a + hdr;
	o->data = (uint8_t *)a + hdr;
	o->data_len = fl;
	o->data_cap = r->stride - hdr;
	o->len = fl;
	o->queue = r->qidx;
	o->err = NULL;
	*bytes += fl;
	return true;
}

/* take_entry is the per-entry work after the ring reader's ownership test
 * and its one read of the entry's fields (id, len; igb's info and status
 * words): the table lookup, the length against the posted one, the
 * caller's record (work), the release of the slot. What cq/ring does for
 * virtio.PackedLayout and SplitLayout with no Codes, and for igb's
 * receive layout; WORK_DRIVER adds what the driver's pass and the queue
 * core do per completion (drv_take). */
ALWAYS_INLINE bool take_entry(struct cq *q, uint32_t layout, enum work work, void *out, int i, uint32_t id, uint32_t ln,
			      uint64_t info, uint32_t st, uint64_t *bytes)
{
	struct table *t = q->tabs[0];
	struct slot *s = table_lookup(t, id);
	if (!s) {
		q->why = "id not outstanding";
		return false;
	}
	if (ln > s->len) {
		q->why = "bad length";
		return false;
	}
	if (work == WORK_RING) {
		struct cq_data_entry *ent = &((struct cq_data_entry *)out)[i];
		uint64_t fl = s->flags;
		ent->op_context = s->ctx;
		ent->flags = fl;
		ent->len = ln;
		ent->buf = (fl & FI_RECV) ? (void *)s->buf : NULL;
		ent->data = 0;
	} else if (!drv_take(q, layout, out, i, s, id, ln, info, st, bytes)) {
		return false;
	}
	if (!s->multi) {
		table_release(t, s, id);
		if (!t->dirty)
			mark_dirty(q, t);
	}
	return true;
}

/* read_end ends a read: the doorbell, the table flushes; the driver
 * variant's per-batch work (the interrupt disarmed if armed, the packet
 * and byte counters, as nic/internal/queue's finish); the unlock. */
ALWAYS_INLINE int read_end(struct cq *q, enum work work, int n, uint64_t bytes)
{
	doorbell_ring(q, q->count);
	for (int i = 0; i < q->ndirty; i++)
		table_flush(q->dirty[i]);
	q->ndirty = 0;
	if (work == WORK_DRIVER && n > 0) {
		struct rxq *r = q->rx;
		if (r->armed)
			r->armed = false;
		atomic_fetch_add_explicit(&r->packets, (uint64_t)n, memory_order_relaxed);
		atomic_fetch_add_explicit(&r->bytes, bytes, memory_order_relaxed);
	}
	pthread_mutex_unlock(&q->mu);
	return n == 0 && q->staged ? -EIO : n;
}

/* read_packed reads a virtio packed ring: a used descriptor has AVAIL and
 * USED both equal to the wrap counter (acquire load of the flags), then
 * its id and len are read once. */
ALWAYS_INLINE int read_packed(struct cq *q, enum work work, void *out, int count)
{
	pthread_mutex_lock(&q->mu);
	if (q->staged) {
		pthread_mutex_unlock(&q->mu);
		return -EIO;
	}
	struct vb_desc *ring = q->descs;
	uint32_t head = q->head, cnt = q->count, size = q->n;
	uint16_t want = q->want ? VB_PACKED_AVAIL | VB_PACKED_USED : 0;
	uint64_t bytes = 0;
	int n = 0;
	while (n < count) {
		struct vb_desc *d = &ring[head];
		if ((atomic_load_explicit(&d->flags, memory_order_acquire) & (VB_PACKED_AVAIL | VB_PACKED_USED)) != want)
			break;
		if (!take_entry(q, VB_LAYOUT_PACKED, work, out, n, d->id, d->len, 0, 0, &bytes)) {
			q->staged = true;
			break;
		}
		head++;
		cnt++;
		if (head == size) {
			head = 0;
			want ^= VB_PACKED_AVAIL | VB_PACKED_USED;
		}
		n++;
	}
	q->head = head;
	q->want = want != 0;
	q->count = cnt;
	return read_end(q, work, n, bytes);
}

/* read_split reads a virtio split used ring: one acquire load of the used
 * index, then the elements before it. */
ALWAYS_INLINE int read_split(struct cq *q, enum work work, void *out, int count)
{
	pthread_mutex_lock(&q->mu);
	if (q->staged) {
		pthread_mutex_unlock(&q->mu);
		return -EIO;
	}
	uint32_t cnt = q->count, size = q->n;
	uint16_t avail = (uint16_t)(atomic_load_explicit(&q->used->idx, memory_order_acquire) - (uint16_t)cnt);
	if (avail > size) {
		q->why = "used index more than a ring ahead";
		q->staged = true;
		pthread_mutex_unlock(&q->mu);
		return -EIO;
	}
	int k = avail < (uint32_t)count ? avail : count, n = 0;
	struct vb_used_elem *ring = q->used->ring;
	uint64_t bytes = 0;
	while (n < k) {
		struct vb_used_elem *e = &ring[cnt & (size - 1)];
		if (!take_entry(q, VB_LAYOUT_SPLIT, work, out, n, e->id, e->len, 0, 0, &bytes)) {
			q->staged = true;
			break;
		}
		cnt++;
		n++;
	}
	q->count = cnt;
	return read_end(q, work, n, bytes);
}

/* read_igb reads igb's receive write-back descriptors, what nic/igb's ring
 * reader does per descriptor: acquire load of the status word and the DD
 * test, then the packet-info quadword and the length read once; the
 * status must be DD|EOP without RXE; the position is the id; the consumed
 * descriptor's DD cleared (cq/ring's DescriptorDone consume). When the
 * ring runs dry, a written descriptor after the head is a hole, as cq/ring
 * checks. */
ALWAYS_INLINE int read_igb(struct cq *q, enum work work, void *out, int count)
{
	pthread_mutex_lock(&q->mu);
	if (q->staged) {
		pthread_mutex_unlock(&q->mu);
		return -EIO;
	}
	struct vb_igb_wb *ring = q->igb;
	uint32_t head = q->head, cnt = q->count, size = q->n;
	uint64_t bytes = 0;
	int n = 0;
	while (n < count) {
		struct vb_igb_wb *d = &ring[head];
		uint32_t st = atomic_load_explicit(&d->status, memory_order_acquire);
		if (!(st & VB_IGB_DD)) {
			/* the head checked again after the next, so that a
			 * descriptor written meanwhile is not taken for a hole
			 * (as cq/ring's hole; in stream mode the device writes
			 * while this runs) */
			uint32_t next = head + 1 == size ? 0 : head + 1;
			if ((atomic_load_explicit(&ring[next].status, memory_order_acquire) & VB_IGB_DD) &&
			    !(atomic_load_explicit(&d->status, memory_order_acquire) & VB_IGB_DD)) {
				q->why = "descriptor done after one that is not (hole)";
				q->staged = true;
			}
			break;
		}
		uint64_t info = d->info;
		uint32_t ln = d->len;
		if ((st & (VB_IGB_DD | VB_IGB_EOP | VB_IGB_RXE)) != (VB_IGB_DD | VB_IGB_EOP)) {
			q->why = "status not DD|EOP, or RXE";
			q->staged = true;
			break;
		}
		if (!take_entry(q, VB_LAYOUT_IGB, work, out, n, head, ln, info, st, &bytes)) {
			q->staged = true;
			break;
		}
		if (work == WORK_RING) {
			/* igb's offload words, kept per descriptor (the driver
			 * keeps them per buffer: drv_take) */
			q->meta[head][0] = info;
			q->meta[head][1] = (uint64_t)st | (uint64_t)ln << 32;
		}
		atomic_store_explicit(&d->status, 0, memory_order_relaxed);
		head++;
		cnt++;
		if (head == size)
			head = 0;
		n++;
	}
	q->head = head;
	q->count = cnt;
	return read_end(q, work, n, bytes);
}

/* cq_read_packed, cq_read_split and cq_read_igb are the ring readers
 * alone: each completion into a fi_cq_data_entry (posted context, flags,
 * length, buffer), igb's write-back words kept per descriptor. */
static int cq_read_packed(struct cq *q, struct cq_data_entry *ents, int count)
{
	return read_packed(q, WORK_RING, ents, count);
}

static int cq_read_split(struct cq *q, struct cq_data_entry *ents, int count)
{
	return read_split(q, WORK_RING, ents, count);
}

static int cq_read_igb(struct cq *q, struct cq_data_entry *ents, int count)
{
	return read_igb(q, WORK_RING, ents, count);
}

/* drv_poll_packed, drv_poll_split and drv_poll_igb are a driver's Poll of
 * a receive queue on the same readers (drv_take, read_end). */
static int drv_poll_packed(struct cq *q, struct drv_completion *out, int count)
{
	return read_packed(q, WORK_DRIVER, out, count);
}

static int drv_poll_split(struct cq *q, struct drv_completion *out, int count)
{
	return read_split(q, WORK_DRIVER, out, count);
}

static int drv_poll_igb(struct cq *q, struct drv_completion *out, int count)
{
	return read_igb(q, WORK_DRIVER, out, count);
}
/* ---- the benchmark ---- */

struct rxbuf {
	uint32_t idx;
	uintptr_t addr;
};

static struct vb_ctrl *ctrl;
static double timeout_s = 20;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "reader: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	if (ctrl)
		atomic_store_explicit(&ctrl->abort_flag, 1, memory_order_release);
	exit(1);
}

/* idle parks the second thread for good. */
static void *idle(void *arg)
{
	(void)arg;
	for (;;)
		pause();
	return NULL;
}

/* start_idle_thread makes the process multi-threaded, so that glibc's
 * pthread mutexes take their lock with a locked instruction: in a process
 * of one thread they execute none, which is not what a thread-safe CQ (Go's
 * locking cq.CQ and Table.Post) costs. The thread only sleeps. */
static void start_idle_thread(void)
{
	pthread_t th;
	int err = pthread_create(&th, NULL, idle, NULL);
	if (err != 0)
		die("pthread_create: %s", strerror(err));
	pthread_detach(th);
}

static inline uint64_t fnv(uint64_t h, uint64_t x)
{
	return (h ^ x) * 0x100000001b3ull;
}

static void usage(void)
{
	fprintf(stderr, "usage: reader -f PATH -b BATCH [-D] [-k] [-T] [-t SECONDS]\n"
			"       reader -l [-L sim|packed|split|igb] [-n ENTRIES] [-c COUNT] -b BATCH [-D] [-k] [-T]\n");
	exit(2);
}

/* map_file waits for the producer's file, maps it and checks its header. */
static struct vb_ctrl *map_file(const char *path)
{
	/* The producer renames the file into place once it is initialised. */
	int fd = -1;
	double deadline = vb_now_s() + timeout_s;
	while ((fd = open(path, O_RDWR | O_CLOEXEC)) < 0) {
		if (errno != ENOENT || vb_now_s() > deadline)
			die("open %s: %s", path, strerror(errno));
		usleep(200);
	}
	struct stat st;
	if (fstat(fd, &st) != 0 || st.st_size < (off_t)VB_CTRL_SIZE)
		die("%s: not a benchmark ring", path);
	void *mem = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (mem == MAP_FAILED)
		die("mmap %s: %s", path, strerror(errno));
	struct vb_ctrl *hdr = mem;
	uint32_t n = hdr->entries;
	if (hdr->magic != VB_MAGIC || hdr->version != VB_VERSION || vb_entry_size(hdr->layout) == 0 ||
	    hdr->entry_size != vb_entry_size(hdr->layout) || n == 0 || (n & (n - 1)) != 0 ||
	    (uint64_t)st.st_size < VB_CTRL_SIZE + (uint64_t)vb_ring_size(hdr->layout, n))
		die("%s: bad header (magic, version, entry size or entries)", path);
	return hdr;
}

/* map_local makes a private ring for local mode, with the header a
 * producer would write. */
static struct vb_ctrl *map_local(uint32_t n, uint64_t count, uint32_t layout)
{
	if (!vb_entries_ok(n) || (layout != VB_LAYOUT_SIM && n > 1u << 15))
		die("%u entries: need a power of two in [%u, 2^24] (2^15 for virtio)", n, 2 * VB_SLACK);
	size_t size = VB_CTRL_SIZE + vb_ring_size(layout, n);
	void *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (mem == MAP_FAILED)
		die("mmap %zu bytes: %s", size, strerror(errno));
	struct vb_ctrl *hdr = mem;
	vb_init_header(hdr, n, VB_MODE_LOCAL, (count + n - 1) / n * n, layout);
	return hdr;
}

static const char *mode_name(uint32_t mode)
{
	switch (mode) {
	case VB_MODE_FILLED:
		return "filled";
	case VB_MODE_STREAM:
		return "stream";
	case VB_MODE_LOCAL:
		return "local";
	}
	return "?";
}

/* rxq_init makes the driver variant's receive queue: n buffers of
 * VB_POST_LEN bytes in memory of its own (the driver reads virtio-net's
 * header in them). */
static void rxq_init(struct rxq *r, uint32_t n, bool igb)
{
	size_t stride = VB_POST_LEN, size = (size_t)n * stride;
	if ((unsigned __int128)size * stride >> 64 != 0)
		die("%u buffers: too many for buf_of's multiplication", n); /* not at n <= 2^24 */
	void *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (mem == MAP_FAILED)
		die("mmap %zu bytes of buffers: %s", size, strerror(errno));
	memset(r, 0, sizeof *r);
	r->mem = mem;
	r->base = (uintptr_t)mem;
	r->stride = stride;
	/* exact for every offset below size (checked above): x * (recip *
	 * stride - 2^64) < 2^64, so floor(x * recip / 2^64) = x / stride */
	r->recip = UINT64_MAX / stride + 1;
	r->nbuf = n;
	r->lent = calloc(n, sizeof *r->lent);
	if (!r->lent || (igb && !(r->meta = calloc(n, sizeof *r->meta))))
		die("out of memory");
}

/* write_net_hdrs writes virtio-net's header, as the device does before
 * each frame it receives (no offloads, num_buffers 1), into every buffer. */
static void write_net_hdrs(struct rxq *r)
{
	for (uint32_t b = 0; b < r->nbuf; b++) {
		uint8_t *h = r->mem + (size_t)b * r->stride;
		memset(h, 0, NET_HDR);
		h[NET_HDR_NUM_BUFFERS] = 1;
	}
}

/* drv_repost posts buffer b again, as the driver's Repost: the buffer
 * must be lent, and is not afterwards; the driver word holds the posting
 * order and the descriptors used (1), as nic/internal/queue's Word. */
static void drv_repost(struct table *tab, struct rxq *rx, struct rxbuf *b, uint64_t order)
{
	if (!rx->lent[b->idx])
		die("re-post of buffer %u, which is not lent", b->idx);
	rx->lent[b->idx] = false;
	struct op op = {b, b->addr, VB_POST_LEN, FI_RECV | FI_MSG, order << 16 | 1};
	if (table_post(tab, &op) < 0)
		die("re-post of buffer %u: table full", b->idx);
	rx->ndescs++;
	rx->nbufs++; /* igb counts descriptors alone */
}

int main(int argc, char **argv)
{
	const char *path = NULL;
	int batch = 32;
	bool check = false, local = false, driver = false;
	uint32_t local_n = 4096;
	uint64_t local_count = 2000000;
	int local_layout = VB_LAYOUT_SIM;
	bool threaded = false;
	int c;
	while ((c = getopt(argc, argv, "f:b:kt:ln:c:L:TD")) != -1) {
		switch (c) {
		case 'L':
			local_layout = vb_parse_layout(optarg);
			if (local_layout < 0)
				usage();
			break;
		case 'T':
			threaded = true;
			break;
		case 'D':
			driver = true;
			break;
		case 'f':
			path = optarg;
			break;
		case 'b':
			batch = atoi(optarg);
			break;
		case 'k':
			check = true;
			break;
		case 't':
			timeout_s = strtod(optarg, NULL);
			break;
		case 'l':
			local = true;
			break;
		case 'n':
			local_n = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case 'c':
			local_count = strtoull(optarg, NULL, 0);
			break;
		default:
			usage();
		}
	}
	if ((!path && !local) || (path && local) || batch < 1)
		usage();
	if (threaded)
		start_idle_thread();
	ctrl = local ? map_local(local_n, local_count, (uint32_t)local_layout) : map_file(path);
	uint32_t layout = ctrl->layout;
	uint32_t n = ctrl->entries;
	if ((uint32_t)batch > ctrl->slack)
		die("batch %d above the producer's slack %u", batch, ctrl->slack);
	if (driver && layout == VB_LAYOUT_SIM)
		die("-D (a driver's Poll) needs the packed, split or igb layout");
	uint32_t mode = ctrl->mode;
	uint64_t total = ctrl->total;
	unsigned shift = (unsigned)__builtin_ctz(n);
	void *ring = (char *)ctrl + VB_CTRL_SIZE;

	/* Ids are the slot index: id bits = log2(N), so the producer, which
	 * completes ids in sequence, needs no generation. */
	static struct table tab;
	if (table_init(&tab, n, shift) != 0)
		die("table of %u entries", n);
	struct table *tabs[1] = {&tab};
	static struct cq q;
	cq_init(&q, ctrl, ring, layout, n, tabs, 1);
	if (layout == VB_LAYOUT_IGB && !(q.meta = calloc(n, sizeof *q.meta)))
		die("out of memory");
	static struct rxq rx;
	uint32_t hdr = layout == VB_LAYOUT_IGB ? 0 : NET_HDR; /* the driver's headroom */
	if (driver) {
		rxq_init(&rx, n, layout == VB_LAYOUT_IGB);
		q.rx = &rx;
		/* The producer (another process) writes no buffer: the headers
		 * are written once here, and num_buffers 1 stays valid from lap
		 * to lap; local mode writes them again in each lap's fill. */
		if (layout != VB_LAYOUT_IGB)
			write_net_hdrs(&rx);
	}

	struct rxbuf *bufs = calloc(n, sizeof *bufs);
	struct cq_data_entry *ents = calloc((size_t)batch, sizeof *ents);
	struct drv_completion *douts = calloc((size_t)batch, sizeof *douts);
	if (!bufs || !ents || !douts)
		die("out of memory");
	const uint64_t recv_flags = FI_RECV | FI_MSG;
	for (uint32_t i = 0; i < n; i++) {
		uintptr_t a = driver ? rx.base + (uintptr_t)i * rx.stride : (uintptr_t)(VB_BUF_BASE + (uint64_t)i * VB_POST_LEN);
		bufs[i] = (struct rxbuf){i, a};
	}
	for (uint32_t i = 0; i < n; i++) {
		struct op op = {&bufs[i], bufs[i].addr, VB_POST_LEN, recv_flags, (uint64_t)i << 16 | 1};
		if (table_post(&tab, &op) != (int64_t)i)
			die("initial post %u did not get its index as id", i);
		rx.ndescs++;
		rx.nbufs++;
	}
	uint64_t posts = n;
	atomic_store_explicit(&ctrl->reader_ready, 1, memory_order_release);

	uint64_t seq = 0, reads = 0, empty = 0, digest = 0xcbf29ce484222325ull;
	double timed = 0;
	uint64_t spins = 0;
	double deadline = vb_now_s() + timeout_s;
	double t0 = vb_now_s();
	bool lapped = mode != VB_MODE_STREAM; /* filled, local: timed lap by lap */
	uint32_t laps = lapped ? (uint32_t)(total / n) : 1;
	for (uint32_t lap = 0; lap < laps; lap++) {
		uint64_t end = lapped ? (uint64_t)(lap + 1) * n : total;
		if (mode == VB_MODE_LOCAL) {
			vb_put_any(ring, layout, (uint64_t)lap * n, n, n, shift);
			if (driver && layout != VB_LAYOUT_IGB)
				write_net_hdrs(&rx); /* as the Go fake device writes them in its fill */
			t0 = vb_now_s();
		} else if (mode == VB_MODE_FILLED) {
			while (atomic_load_explicit(&ctrl->produced, memory_order_acquire) < end) {
				vb_pause();
				if ((++spins & 4095) == 0) {
					if (atomic_load_explicit(&ctrl->abort_flag, memory_order_acquire))
						die("the producer gave up");
					if (vb_now_s() > deadline)
						die("timed out waiting for lap %u", lap);
				}
			}
			t0 = vb_now_s();
		}
		while (seq < end) {
			int k = driver ? (layout == VB_LAYOUT_PACKED  ? drv_poll_packed(&q, douts, batch)
					  : layout == VB_LAYOUT_SPLIT ? drv_poll_split(&q, douts, batch)
								      : drv_poll_igb(&q, douts, batch))
				: layout == VB_LAYOUT_PACKED ? cq_read_packed(&q, ents, batch)
				: layout == VB_LAYOUT_SPLIT  ? cq_read_split(&q, ents, batch)
				: layout == VB_LAYOUT_IGB    ? cq_read_igb(&q, ents, batch)
							     : cq_read(&q, ents, batch);
			reads++;
			if (k <= 0) {
				if (k < 0)
					die("read at completion %" PRIu64 ": %s", seq, k == -EIO ? q.why : "ring overrun");
				empty++;
				if ((empty & 65535) == 0) {
					if (atomic_load_explicit(&ctrl->abort_flag, memory_order_acquire))
						die("the producer gave up");
					if (vb_now_s() > deadline)
						die("timed out at completion %" PRIu64, seq);
				}
				continue;
			}
			for (int i = 0; i < k; i++) {
				struct rxbuf *b;
				if (driver) {
					struct drv_completion *o = &douts[i];
					b = o->ctx;
					if (b->idx != (uint32_t)(seq & (n - 1)) || o->len != VB_LEN(seq) - hdr)
						die("out of order at completion %" PRIu64 ": buffer %u, len %zu", seq,
						    b->idx, o->len);
					if (check) {
						/* every field of the record, and what the
						 * queue kept of the buffer, against what it
						 * must hold (bench_test.go recomputes the
						 * digest from the producer's sequence) */
						uint32_t bi = b->idx;
						if (o->buf != b->addr + hdr || o->data != (uint8_t *)o->buf ||
						    o->data_len != o->len || o->data_cap != rx.stride - hdr || o->queue != 0 ||
						    o->err != NULL || !rx.lent[bi])
							die("completion %" PRIu64 ": record or lent flag wrong", seq);
						digest = fnv(digest, bi);
						digest = fnv(digest, o->buf - rx.base);
						digest = fnv(digest, (uint64_t)(o->data - rx.mem));
						digest = fnv(digest, o->data_len);
						digest = fnv(digest, o->data_cap);
						digest = fnv(digest, o->len);
						digest = fnv(digest, (uint64_t)o->queue);
						if (layout == VB_LAYOUT_IGB) {
							digest = fnv(digest, rx.meta[bi][0]);
							digest = fnv(digest, rx.meta[bi][1]);
						}
					}
				} else {
					struct cq_data_entry *e = &ents[i];
					b = e->op_context;
					if (layout == VB_LAYOUT_SIM ? e->data != seq
								    : b->idx != (uint32_t)(seq & (n - 1)) || e->len != VB_LEN(seq))
						die("out of order at completion %" PRIu64 ": data %" PRIu64
						    ", buffer %u, len %zu",
						    seq, e->data, b->idx, e->len);
					if (check) {
						digest = fnv(digest, b->idx);
						digest = fnv(digest, e->flags);
						digest = fnv(digest, e->len);
						digest = fnv(digest, (uint64_t)(uintptr_t)e->buf - VB_BUF_BASE);
						digest = fnv(digest, e->data);
					}
				}
				seq++;
				if (lapped)
					continue; /* re-posted after the timed reads */
				if (driver) {
					drv_repost(&tab, &rx, b, posts++);
				} else {
					struct op op = {b, b->addr, VB_POST_LEN, recv_flags, 0};
					if (table_post(&tab, &op) < 0)
						die("re-post at completion %" PRIu64 ": table full", seq);
				}
			}
		}
		if (lapped) {
			timed += vb_now_s() - t0;
			/* The lap completed ids 0..N-1 in order (data == sequence
			 * checked above), so the buffers go back in that order. */
			for (uint32_t i = 0; i < n; i++) {
				if (driver) {
					drv_repost(&tab, &rx, &bufs[i], posts++);
					continue;
				}
				struct op op = {&bufs[i], bufs[i].addr, VB_POST_LEN, recv_flags, 0};
				if (table_post(&tab, &op) < 0)
					die("re-post of buffer %u after lap %u: table full", i, lap);
			}
			atomic_store_explicit(&ctrl->laps_done, lap + 1, memory_order_release);
			deadline = vb_now_s() + timeout_s;
		}
	}
	if (!lapped)
		timed = vb_now_s() - t0;
	if (driver) {
		/* the counters and counts: every completion counted once, every
		 * buffer posted again */
		uint64_t want_bytes = 0;
		for (uint64_t s = 0; s < seq; s++)
			want_bytes += VB_LEN(s) - hdr;
		if (atomic_load(&rx.packets) != seq || atomic_load(&rx.bytes) != want_bytes || rx.ndescs != (int)n ||
		    (layout != VB_LAYOUT_IGB && rx.nbufs != (int)n))
			die("counters %" PRIu64 " packets, %" PRIu64 " bytes (want %" PRIu64 ", %" PRIu64
			    "), %d descriptors and %d buffers outstanding (want %u)",
			    atomic_load(&rx.packets), atomic_load(&rx.bytes), seq, want_bytes, rx.ndescs, rx.nbufs, n);
	}
	char dig[32] = "-";
	if (check)
		snprintf(dig, sizeof dig, "%016" PRIx64, digest);
	printf("reader=c work=%s layout=%s locking=%s mode=%s batch=%d entries=%u completions=%" PRIu64
	       " ns_per_completion=%.3f reads=%" PRIu64 " empty_reads=%" PRIu64
	       " allocs_per_completion=n/a order=ok digest=%s\n",
	       driver ? "driver" : "ring", vb_layout_names[layout], threaded ? "mutex" : "none", mode_name(mode), batch,
	       n, seq, timed * 1e9 / (double)seq, reads, empty, dig);
	return 0;
}
