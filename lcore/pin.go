package lcore

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// AnyCPU, as Config.CPU, locks the core to an OS thread without pinning the
// thread to a CPU.
const AnyCPU = -1

// maxCPU bounds the CPU numbers unix.CPUSet holds.
const maxCPU = len(unix.CPUSet{}) * 64

// pinnedThreads holds the affinity from before pinning of every thread a
// core has pinned. Go may run any goroutine, a core's included, on the
// process's main thread, whose affinity is the process's as tools (and
// AllowedCPUs) read it: while a core pins it, the saved one is the truth.
var pinnedThreads struct {
	sync.Mutex
	old map[int]unix.CPUSet
}

// AllowedCPUs returns the CPUs this process may run on (its main thread's
// affinity from before any core pinned it: taskset, cgroups cpusets), in
// increasing order.
func AllowedCPUs() ([]int, error) {
	var set unix.CPUSet
	pinnedThreads.Lock()
	old, ok := pinnedThreads.old[os.Getpid()]
	pinnedThreads.Unlock()
	if ok {
		set = old
	} else if err := unix.SchedGetaffinity(os.Getpid(), &set); err != nil {
		return nil, fmt.Errorf("lcore: sched_getaffinity: %w", err)
	}
	var cpus []int
	for i := 0; i < maxCPU; i++ {
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	return cpus, nil
}

// checkCPU returns why cpu cannot be pinned to, or nil.
func checkCPU(cpu int) error {
	if cpu == AnyCPU {
		return nil
	}
	if cpu < 0 || cpu >= maxCPU {
		return fmt.Errorf("%w: CPU %d (CPUs are numbered from 0, or AnyCPU)", ErrCPU, cpu)
	}
	allowed, err := AllowedCPUs()
	if err != nil {
		return err
	}
	for _, c := range allowed {
		if c == cpu {
			return nil
		}
	}
	return fmt.Errorf("%w: CPU %d is not among this process's allowed CPUs (%s)", ErrCPU, cpu, cpuList(allowed))
}

// cpuList formats CPUs as Linux's lists do: "0-3,6".
func cpuList(cpus []int) string {
	var b strings.Builder
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(cpus[i]))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(cpus[j]))
		}
		i = j + 1
	}
	return b.String()
}

// pinned is a thread pinned to a CPU, with the affinity to restore.
type pinned struct {
	tid int
	old unix.CPUSet
}

// pin pins the calling thread (locked by the caller) to cpu.
func pin(cpu int) (pinned, error) {
	p := pinned{tid: unix.Gettid()}
	if cpu == AnyCPU {
		return p, nil
	}
	if err := unix.SchedGetaffinity(0, &p.old); err != nil {
		return p, fmt.Errorf("lcore: sched_getaffinity: %w", err)
	}
	var set unix.CPUSet
	set.Set(cpu)
	pinnedThreads.Lock()
	defer pinnedThreads.Unlock()
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		// EINVAL: the CPU left the allowed set since New checked it.
		return p, fmt.Errorf("%w: pin thread %d to CPU %d: %v", ErrCPU, p.tid, cpu, err)
	}
	if pinnedThreads.old == nil {
		pinnedThreads.old = make(map[int]unix.CPUSet)
	}
	pinnedThreads.old[p.tid] = p.old
	return p, nil
}

// restore gives the calling thread its affinity from before pin.
func (p pinned) restore(cpu int) error {
	if cpu == AnyCPU {
		return nil
	}
	pinnedThreads.Lock()
	defer pinnedThreads.Unlock()
	if err := unix.SchedSetaffinity(0, &p.old); err != nil {
		return fmt.Errorf("lcore: restore the affinity of thread %d: %w", p.tid, err)
	}
	delete(pinnedThreads.old, p.tid)
	return nil
}
