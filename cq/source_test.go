package cq

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeSource is a device completion ring for this package's tests:
// produce makes entries ready, and an armed ring signals the CQ's eventfd
// once its own ready count reaches the threshold it was armed with, as a
// device counts per ring.
type fakeSource struct {
	c     *CQ
	mu    sync.Mutex
	ready int
	armed bool
	thr   int
	arms  []int // the thresholds it was armed with
}

func (s *fakeSource) Attach(Format) error { return nil }

func (s *fakeSource) Poll(ents []Entry, _ []Addr) (int, SourceState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := min(len(ents), s.ready)
	s.ready -= n
	return n, SourceOK
}

func (s *fakeSource) Pending(max int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return min(max, s.ready)
}

func (s *fakeSource) ReadErr(*ErrEntry) ([]byte, bool) { return nil, false }

func (s *fakeSource) Arm(_ bool, thr int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.armed, s.thr = true, max(thr, 1)
	s.arms = append(s.arms, thr)
	s.fireLocked()
	return nil
}

func (s *fakeSource) StrError(ProvErrno, []byte) (string, bool) { return "", false }
func (s *fakeSource) Close() error                              { return nil }

func (s *fakeSource) armedWith() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int(nil), s.arms...)
}

func (s *fakeSource) produce(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ready += n
	s.fireLocked()
}

// fireLocked interrupts once for an armed threshold that is reached.
func (s *fakeSource) fireLocked() {
	if s.armed && s.ready >= s.thr {
		s.armed = false
		if s.c.wait != nil {
			_ = s.c.wait.Add(1)
		}
	}
}

// A source added while another goroutine reads (a QP created on a CQ that
// other threads poll) is a change the reader need not lock against, even
// on a SingleThreaded CQ (verbs serialises its reads, not its QP
// creation): under -race, any unsynchronised access to the CQ's sources
// fails the test. The reader sees every source added.
func TestAddSourceWhileReading(t *testing.T) {
	for _, single := range []bool{true, false} {
		c, err := New(Attr{WaitObj: WaitFD, SingleThreaded: single}, Limits{})
		require.NoError(t, err)
		require.NoError(t, c.addSource(&fakeSource{c: c}))
		const adds = 16
		got := make(chan int, 1)
		go func() {
			ents := make([]Entry, 4)
			n := 0
			deadline := time.Now().Add(10 * time.Second)
			for i := 0; n < adds && time.Now().Before(deadline); i++ {
				// Every way a reader walks the sources.
				switch i % 6 {
				case 0:
					k, _ := c.Read(ents)
					n += k
				case 1:
					_, _ = c.Read(nil)
				case 2:
					_ = c.ReadErr(&ErrEntry{})
				case 3:
					_, _ = c.ReqNotify(false)
				case 4:
					_ = c.TryWait()
				case 5:
					_ = c.pending(2)
				}
			}
			got <- n
		}()
		for range adds {
			s := &fakeSource{c: c}
			s.produce(1)
			require.NoError(t, c.addSource(s))
			time.Sleep(100 * time.Microsecond)
		}
		require.Equal(t, adds, <-got, "single=%v: entries of the sources added", single)
		require.NoError(t, c.Close())
	}
}
