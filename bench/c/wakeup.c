// wakeup.c: the C reference for vfnic's wake-up benchmark (see README.md).
// A reader thread sleeps in epoll_wait on an eventfd and reads it, as a
// DPDK lcore in l3fwd-power sleeps on its queue's interrupt; the main
// thread writes the eventfd after a random pause that leaves the reader
// asleep, and measures the time from just before write(2) to the reader's
// return from read(2); the writer sleeps meanwhile, so that a reader on the
// same CPU does not compete with it. Prints one line: mode=c samples= median_ns= p90_ns=
// p99_ns= max_ns=.
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

static int efd, epfd;
static int reader_cpu = -1;
static _Atomic uint64_t woke_at; // the reader's timestamp, 0 while waiting
static _Atomic int stop;

static uint64_t now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void pin(int cpu) {
	if (cpu < 0)
		return;
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof set, &set) != 0) {
		perror("sched_setaffinity");
		exit(1);
	}
}

static void *reader(void *arg) {
	(void)arg;
	pin(reader_cpu);
	struct epoll_event ev;
	uint64_t v;
	while (!atomic_load(&stop)) {
		int n = epoll_wait(epfd, &ev, 1, -1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			perror("epoll_wait");
			exit(1);
		}
		if (read(efd, &v, sizeof v) != sizeof v)
			continue;
		atomic_store_explicit(&woke_at, now_ns(), memory_order_release);
	}
	return NULL;
}

static int cmp(const void *a, const void *b) {
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
	int samples = 2000, writer_cpu = -1, opt;
	while ((opt = getopt(argc, argv, "n:r:w:")) != -1) {
		switch (opt) {
		case 'n': samples = atoi(optarg); break;
		case 'r': reader_cpu = atoi(optarg); break;
		case 'w': writer_cpu = atoi(optarg); break;
		default:
			fprintf(stderr, "usage: %s [-n samples] [-r reader-cpu] [-w writer-cpu]\n", argv[0]);
			return 2;
		}
	}
	if (samples < 1) {
		fprintf(stderr, "wakeup: -n must be positive\n");
		return 2;
	}
	efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	epfd = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = {.events = EPOLLIN};
	if (efd < 0 || epfd < 0 || epoll_ctl(epfd, EPOLL_CTL_ADD, efd, &ev) != 0) {
		perror("eventfd/epoll");
		return 1;
	}
	pin(writer_cpu);
	pthread_t th;
	if (pthread_create(&th, NULL, reader, NULL) != 0) {
		perror("pthread_create");
		return 1;
	}
	uint64_t *lat = calloc(samples, sizeof *lat);
	unsigned seed = 1;
	for (int i = 0; i < samples; i++) {
		// 50 to 150 us: the reader is asleep again when the write comes.
		struct timespec pause = {0, 50000 + rand_r(&seed) % 100000};
		nanosleep(&pause, NULL);
		atomic_store(&woke_at, 0);
		uint64_t one = 1, t0 = now_ns();
		if (write(efd, &one, sizeof one) != sizeof one) {
			perror("write");
			return 1;
		}
		// The writer sleeps while the reader wakes, so that on one CPU
		// the two do not compete: only the reader's path is measured.
		uint64_t t1, deadline = t0 + 1000000000u;
		struct timespec nap = {0, 20000};
		while ((t1 = atomic_load_explicit(&woke_at, memory_order_acquire)) == 0) {
			if (now_ns() > deadline) {
				fprintf(stderr, "wakeup: reader did not wake within 1 s\n");
				return 1;
			}
			nanosleep(&nap, NULL);
		}
		lat[i] = t1 - t0;
	}
	atomic_store(&stop, 1);
	uint64_t one = 1;
	if (write(efd, &one, sizeof one) < 0)
		perror("write");
	pthread_join(th, NULL);
	qsort(lat, samples, sizeof *lat, cmp);
	printf("mode=c samples=%d median_ns=%llu p90_ns=%llu p99_ns=%llu max_ns=%llu\n", samples,
	       (unsigned long long)lat[samples / 2], (unsigned long long)lat[samples * 90 / 100],
	       (unsigned long long)lat[samples * 99 / 100], (unsigned long long)lat[samples - 1]);
	return 0;
}
