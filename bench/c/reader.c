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
 * Usage: reader -f PATH -b BATCH [-k] [-t SECONDS]
 *        reader -l [-n ENTRIES] [-c COUNT] -b BATCH [-k]
 * -l is local mode: no producer; the reader writes each lap itself (the
 * producer's code, untimed) and times its reads of the full ring, with the
 * entries hot in its own cache: the CPU cost of the read path alone.
 * -k computes a digest of every converted field (for the Go test). Prints
 * one line: reader=c mode=... batch=... ns_per_completion=... order=ok ...
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
	if (!t->slots || !t->freeq)
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

/* take_virtio checks and converts a used virtio buffer (id, len): the
 * table lookup, the length against the posted one, the posted flags (a
 * virtio ring has no status, opcode or data), the release. What cq/ring
 * does for virtio.PackedLayout and SplitLayout with no Codes. */
static inline bool take_virtio(struct cq *q, uint32_t id, uint32_t ln, struct cq_data_entry *ent)
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
	uint64_t fl = s->flags;
	ent->op_context = s->ctx;
	ent->flags = fl;
	ent->len = ln;
	ent->buf = (fl & FI_RECV) ? (void *)s->buf : NULL;
	ent->data = 0;
	if (!s->multi) {
		table_release(t, s, id);
		if (!t->dirty)
			mark_dirty(q, t);
	}
	return true;
}

/* cq_end ends a read: the doorbell, the table flushes, the unlock. */
static inline int cq_end(struct cq *q, int n)
{
	doorbell_ring(q, q->count);
	for (int i = 0; i < q->ndirty; i++)
		table_flush(q->dirty[i]);
	q->ndirty = 0;
	pthread_mutex_unlock(&q->mu);
	return n == 0 && q->staged ? -EIO : n;
}

/* cq_read_packed is cq_read over a virtio packed ring: a used descriptor
 * has AVAIL and USED both equal to the wrap counter (acquire load of the
 * flags), then its id and len are read once. */
static int cq_read_packed(struct cq *q, struct cq_data_entry *ents, int count)
{
	pthread_mutex_lock(&q->mu);
	if (q->staged) {
		pthread_mutex_unlock(&q->mu);
		return -EIO;
	}
	struct vb_desc *ring = q->descs;
	uint32_t head = q->head, cnt = q->count, size = q->n;
	uint16_t want = q->want ? VB_PACKED_AVAIL | VB_PACKED_USED : 0;
	int n = 0;
	while (n < count) {
		struct vb_desc *d = &ring[head];
		if ((atomic_load_explicit(&d->flags, memory_order_acquire) & (VB_PACKED_AVAIL | VB_PACKED_USED)) != want)
			break;
		if (!take_virtio(q, d->id, d->len, &ents[n])) {
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
	return cq_end(q, n);
}

/* cq_read_split is cq_read over a virtio split used ring: one acquire load
 * of the used index, then the elements before it. */
static int cq_read_split(struct cq *q, struct cq_data_entry *ents, int count)
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
	while (n < k) {
		struct vb_used_elem *e = &ring[cnt & (size - 1)];
		if (!take_virtio(q, e->id, e->len, &ents[n])) {
			q->staged = true;
			break;
		}
		cnt++;
		n++;
	}
	q->count = cnt;
	return cq_end(q, n);
}

/* cq_read_igb is cq_read over igb's receive write-back descriptors, what
 * nic/igb does per descriptor: acquire load of the status word and the DD
 * test, then the packet-info quadword and the length read once; the
 * status must be DD|EOP without RXE; the position is the id; the two
 * write-back quadwords kept per buffer (igb's offload words); the
 * consumed descriptor's DD cleared (cq/ring's DescriptorDone consume).
 * When the ring runs dry, a written descriptor after the head is a hole,
 * as cq/ring checks. */
static int cq_read_igb(struct cq *q, struct cq_data_entry *ents, int count)
{
	pthread_mutex_lock(&q->mu);
	if (q->staged) {
		pthread_mutex_unlock(&q->mu);
		return -EIO;
	}
	struct vb_igb_wb *ring = q->igb;
	uint32_t head = q->head, cnt = q->count, size = q->n;
	int n = 0;
	while (n < count) {
		struct vb_igb_wb *d = &ring[head];
		uint32_t st = atomic_load_explicit(&d->status, memory_order_acquire);
		if (!(st & VB_IGB_DD)) {
			uint32_t next = head + 1 == size ? 0 : head + 1;
			if (atomic_load_explicit(&ring[next].status, memory_order_acquire) & VB_IGB_DD) {
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
		if (!take_virtio(q, head, ln, &ents[n])) {
			q->staged = true;
			break;
		}
		q->meta[head][0] = info;
		q->meta[head][1] = (uint64_t)st | (uint64_t)ln << 32;
		atomic_store_explicit(&d->status, 0, memory_order_relaxed);
		head++;
		cnt++;
		if (head == size)
			head = 0;
		n++;
	}
	q->head = head;
	q->count = cnt;
	return cq_end(q, n);
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
	fprintf(stderr, "usage: reader -f PATH -b BATCH [-k] [-T] [-t SECONDS]\n"
			"       reader -l [-L sim|packed|split|igb] [-n ENTRIES] [-c COUNT] -b BATCH [-k] [-T]\n");
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

int main(int argc, char **argv)
{
	const char *path = NULL;
	int batch = 32;
	bool check = false, local = false;
	uint32_t local_n = 4096;
	uint64_t local_count = 2000000;
	int local_layout = VB_LAYOUT_SIM;
	bool threaded = false;
	int c;
	while ((c = getopt(argc, argv, "f:b:kt:ln:c:L:T")) != -1) {
		switch (c) {
		case 'L':
			local_layout = vb_parse_layout(optarg);
			if (local_layout < 0)
				usage();
			break;
		case 'T':
			threaded = true;
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

	struct rxbuf *bufs = calloc(n, sizeof *bufs);
	struct cq_data_entry *ents = calloc((size_t)batch, sizeof *ents);
	if (!bufs || !ents)
		die("out of memory");
	const uint64_t recv_flags = FI_RECV | FI_MSG;
	for (uint32_t i = 0; i < n; i++) {
		bufs[i] = (struct rxbuf){i, (uintptr_t)(VB_BUF_BASE + (uint64_t)i * VB_POST_LEN)};
		struct op op = {&bufs[i], bufs[i].addr, VB_POST_LEN, recv_flags};
		if (table_post(&tab, &op) != (int64_t)i)
			die("initial post %u did not get its index as id", i);
	}
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
			int k = layout == VB_LAYOUT_PACKED  ? cq_read_packed(&q, ents, batch)
				: layout == VB_LAYOUT_SPLIT ? cq_read_split(&q, ents, batch)
				: layout == VB_LAYOUT_IGB   ? cq_read_igb(&q, ents, batch)
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
				struct cq_data_entry *e = &ents[i];
				struct rxbuf *b = e->op_context;
				if (layout == VB_LAYOUT_SIM ? e->data != seq
							    : b->idx != (uint32_t)(seq & (n - 1)) || e->len != VB_LEN(seq))
					die("out of order at completion %" PRIu64 ": data %" PRIu64 ", buffer %u, len %zu", seq,
					    e->data, b->idx, e->len);
				if (check) {
					digest = fnv(digest, b->idx);
					digest = fnv(digest, e->flags);
					digest = fnv(digest, e->len);
					digest = fnv(digest, (uint64_t)(uintptr_t)e->buf - VB_BUF_BASE);
					digest = fnv(digest, e->data);
				}
				seq++;
				if (lapped)
					continue; /* re-posted after the timed reads */
				struct op op = {b, b->addr, VB_POST_LEN, recv_flags};
				if (table_post(&tab, &op) < 0)
					die("re-post at completion %" PRIu64 ": table full", seq);
			}
		}
		if (lapped) {
			timed += vb_now_s() - t0;
			/* The lap completed ids 0..N-1 in order (data == sequence
			 * checked above), so the buffers go back in that order. */
			for (uint32_t i = 0; i < n; i++) {
				struct op op = {&bufs[i], bufs[i].addr, VB_POST_LEN, recv_flags};
				if (table_post(&tab, &op) < 0)
					die("re-post of buffer %u after lap %u: table full", i, lap);
			}
			atomic_store_explicit(&ctrl->laps_done, lap + 1, memory_order_release);
			deadline = vb_now_s() + timeout_s;
		}
	}
	if (!lapped)
		timed = vb_now_s() - t0;
	char dig[32] = "-";
	if (check)
		snprintf(dig, sizeof dig, "%016" PRIx64, digest);
	printf("reader=c layout=%s locking=%s mode=%s batch=%d entries=%u completions=%" PRIu64
	       " ns_per_completion=%.3f reads=%" PRIu64 " empty_reads=%" PRIu64
	       " allocs_per_completion=n/a order=ok digest=%s\n",
	       vb_layout_names[layout], threaded ? "mutex" : "none", mode_name(mode), batch, n,
	       seq, timed * 1e9 / (double)seq, reads, empty, dig);
	return 0;
}
