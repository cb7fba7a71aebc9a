// Package qpsim simulates a verbs-style device of queue pairs and
// completion queues (a software NIC, not a nic.Device): a device loop in
// its own goroutine, locked to an OS thread, that reads descriptor rings and doorbells in DMA memory,
// loops sent frames back to receive queues, and writes real completion
// entries into completion rings, raising "interrupts" through the CQ's
// eventfd. It lets the cq package, and every layer above it, be tested and
// benchmarked on the host without a VM, and it injects the faults that real
// hardware produces rarely (error completions, corrupted entries, a wrong
// phase bit, overrun, lost and spurious interrupts).
//
// All memory the device touches comes from a dma identity space (IOVA ==
// virtual address); the device translates every address it is given through
// its list of regions, so a bad address becomes a LOCAL_PROT_ERR completion,
// never a stray access.
//
// # Completion entry (CQE), 64 bytes, little-endian
//
//	off size field
//	  0  u32  id        the id the driver put in the descriptor (ring.Table id)
//	  4  u16  queue     device queue: 2k for QP k's send queue, 2k+1 for its receive queue
//	  6  u8   opcode    0 SEND, 1 RECV, 2 WRITE, 3 READ, 4 RECV_RDMA_WITH_IMM
//	  7  u8   status    0 OK, 1 LOCAL_LEN_ERR, 2 LOCAL_PROT_ERR, 3 WR_FLUSH_ERR,
//	                    4 REMOTE_ACCESS_ERR, 5 GENERAL_ERR
//	  8  u32  byte_len  bytes sent or received (the full frame length on LOCAL_LEN_ERR)
//	 12  u32  dev_flags bit0 HAS_DATA, bit1 TAGGED, bit2 MULTI_RECV, bit3 MORE, bit4 HAS_SRC
//	 16  u64  data      remote CQ data / immediate (valid with HAS_DATA)
//	 24  u64  tag       message tag (valid with TAGGED)
//	 32  u64  src       source address: the sending QP's Addr (valid with HAS_SRC)
//	 40  u32  syndrome  vendor error detail
//	 44  u32  buf_off   offset of the data inside a multi-receive buffer
//	 48  12 B reserved  written as 0
//	 60  u32  owner     bit 31 = phase; the other bits are 0
//
// The phase is 1 on the first lap of the ring and flips on every lap (NVMe
// style). The device writes bytes 0..59 first and the owner word last, with
// a release store (one MOV on amd64, whose stores are ordered); the reader
// loads the owner word atomically before anything else.
//
// # Completion queue status page (64 bytes after the ring)
//
//	off size  writer  meaning
//	  0  u32  driver  consumer count: entries consumed, free-running (doorbell, once per batch)
//	  8  u64  driver  arm doorbell: bits 0-31 consumer count at arm time, 32-47 threshold
//	                  (0 = 1), bit 48 solicited only, bits 56-63 sequence (changes on every arm)
//	 16  u32  device  overrun: bit 0 set when a completion found the ring full
//	 20  u32  device  producer count (informational)
//
// The device never overwrites an entry the driver has not consumed: when
// producer - consumer == size it sets the overrun bit, raises an interrupt
// and drops every later completion for that CQ (the CQ is fatal).
//
// Arming follows mlx5's EVENT-style doorbell: an arm carries the consumer
// count, and the device fires at once if it has already written
// threshold entries beyond it, which closes the race between a driver's last
// poll and its arm. One arm gives one interrupt.
//
// # Descriptors (send and receive queues), 64 bytes, little-endian
//
//	off size field
//	  0  u64  addr      IOVA of the buffer
//	  8  u32  len       buffer length (send: frame length, at most MaxFrame)
//	 12  u32  id        echoed in the CQE
//	 16  u64  data      send: remote CQ data (with HAS_DATA)
//	 24  u64  tag       send: tag (with TAGGED)
//	 32  u64  dest      send: the destination QP's Addr
//	 40  u32  flags     bit0 HAS_DATA, bit1 TAGGED, bit2 MULTI_RECV (receive), bit3 SOLICITED (send)
//	 44  u32  min_free  receive, multi-receive: release the buffer when less remains
//	 48  u8   opcode    send: 0 SEND
//
// # Queue pair status page (64 bytes)
//
//	 0  u32  driver  send queue tail (doorbell: descriptors posted, free-running)
//	 4  u32  driver  receive queue tail (doorbell)
//	 8  u32  device  send queue head (descriptors consumed)
//	12  u32  device  receive queue head
//
// The device loop polls the doorbells while busy, spins a short while when
// idle, then sleeps on a kick eventfd that drivers write only when the
// device has said it is asleep.
package qpsim
