// Package lcore runs polling cores: the Go counterpart of a DPDK lcore. A
// Core owns one or more NIC queues (nic.RxQueue, nic.TxQueue), runs on one
// goroutine locked to an OS thread, pins that thread to the CPU it is given
// (sched_setaffinity), and polls its queues in batches: it reads up to
// Batch completions from each queue, hands them to the queue's Handler,
// runs its Funcs (work not driven by completions, such as generating frames
// to send), then flushes the queues once, so that the posts of one
// iteration reach the device with one doorbell. The loop allocates
// nothing; the rest of the program keeps running on the other CPUs.
//
// Three modes say what the core does when its queues are empty:
//
//   - Busy polls without pause, as DPDK's testpmd does: the lowest
//     latency, one CPU at 100% whatever the load.
//   - Adaptive polls while work arrives; after IdleInterval without any
//     (default 300 µs), it arms the interrupts of its queues, polls once
//     more (a completion written before the arm raises no interrupt),
//     then sleeps in epoll_wait on the queues' interrupt eventfds from its
//     own thread, until an interrupt, Wake, Close or the context wakes it,
//     or a second passes: closing a queue (its device closed, or taken
//     back by the kernel) closes its eventfd, which wakes no epoll_wait,
//     and the core stops at the next look.
//     This is Linux NAPI's and DPDK l3fwd-power's pattern: a loaded queue
//     runs at the busy rate, an idle one costs almost no CPU. A core whose
//     transmit queue has sends outstanding is waiting for the device, not
//     idle: it polls up to 32 idle intervals before it sleeps, because a
//     sleep adds a wake-up to the time the ring stays full (in a QEMU
//     guest over a millisecond: at full load under TCG, 250-450 such
//     sleeps per 5 s cost adaptive mode up to a tenth of the busy rate).
//   - Interrupt arms and sleeps as soon as one round of polls finds
//     nothing: SRead's semantics, one batch per wake-up.
//
// Sleeping in epoll_wait on the locked thread, rather than parking the
// goroutine on Go's runtime poller, makes a wake-up one thread wake-up
// instead of a poller wake-up followed by a hand-off to the locked thread
// (bench/wakeup measures both against C). SRead on a pinned thread sleeps
// the same way (eventfd.FD.Wait). A pinned core that sleeps also directs
// its queues' interrupts to its CPU when it starts (nic.InterruptSteerer,
// the MSI-X vector's IRQ affinity; Config.KeepIRQAffinity opts out), as a
// kernel driver's affinity hint does, so that the interrupt wakes the
// thread where it sleeps: otherwise the kernel may deliver it to another
// CPU, which then has to wake the core's with an inter-processor
// interrupt (in a QEMU guest, each one a halted vCPU the host wakes).
// Such a core also asks Linux for a short scheduler slice (WakeSlice;
// Config.KeepSlice opts out), so that its wake-up preempts whatever runs
// on its CPU: without it, a core that has just polled (Adaptive) usually
// waits for that task to sleep first (bench/wakeup: 18-22 us against
// 4-6 us on a CPU shared with the writer).
//
// A Core is stopped by its context, by Close (which a Handler or Func may
// call too), or by a Handler or Func that returns an error. A core started with Start runs on a goroutine of its
// own whose thread the runtime discards when the core stops, so that no
// thread with a pinned affinity goes back to the scheduler's pool; Run
// runs the loop on the calling goroutine and restores the thread's
// affinity before it returns. A Handler or Func that panics stops a core
// in Run, and the panic goes on to Run's caller; on a core started with
// Start it ends the program, as a panic on any goroutine does.
//
// GOMAXPROCS counts the core's thread: a busy core keeps one P for itself,
// and the rest of the program shares the others.
//
// What the runtime costs a busy core: every 10 ms the runtime's sysmon
// preempts a goroutine that has run that long, and a goroutine locked to
// its thread cannot simply be resumed there: the runtime hands the P to
// another thread, which hands it back (up to three futex wake-ups, two on
// another CPU; golang/go#21827). No API turns this off. In a QEMU guest
// under TCG, where waking the other vCPU costs the host the time its
// device thread needs, it cost busy mode about 9% of its rate
// (bench/vm/runtime-ab.sh compares a runtime built without forced
// preemption). Yielding first does not help: a core that unlocked itself
// and called runtime.Gosched every 5 ms (so that its own thread took it
// back and sysmon never had to preempt it) was no faster, 0.94x of DPDK
// against 0.98x in three alternating pairs of bench/vm, since every
// Gosched wakes a spinning thread on the other CPU (wakep) and so doubles
// that CPU's function-call IPIs.
//
// Measuring: bench/wakeup/run.sh times the wake-up against C;
// `VFNIC_LCORE_BENCH=1 go test -run TestVM ./lcore` boots a guest and
// compares the transmit rate of a core in each mode with a pktgen-style
// loop on an ordinary goroutine. Package lcoretest is a software queue (a
// nic/softnic receive queue whose frames the test injects) for testing
// code that runs on a core.
package lcore
