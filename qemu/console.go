package qemu

import (
	"bytes"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Phases of a guest run, as seen on its console.
const (
	phaseBoot    = iota // kernel booting, /init not yet running
	phaseSetup          // /init running: modules, hugepages, NIC binding
	phasePayload        // payload running
	phaseEnded          // payload ended, exit status and kernel log follow
	phaseKlog           // kernel log of the payload's run
	phaseDone           // all markers seen
)

// console splits the guest's serial output into the whole console, the
// payload's output and the markers /init prints. It is the io.Writer QEMU's
// serial port is copied into.
type console struct {
	mu          sync.Mutex
	nonce       string
	start       time.Time
	liveConsole io.Writer
	liveOutput  io.Writer

	all     bytes.Buffer
	partial []byte
	out     bytes.Buffer
	klog    bytes.Buffer

	phase         int
	kernelVersion string
	bootTime      time.Duration
	setupErr      string
	exitCode      int
	haveExit      bool
	info          []string // VFIO / NET marker lines
	collect       string   // the COLLECT marker's status, "" if none came
	missing       []string // Collect paths the payload did not write
}

func newConsole(nonce string, liveConsole, liveOutput io.Writer) *console {
	return &console{nonce: nonce, start: time.Now(), liveConsole: liveConsole, liveOutput: liveOutput, exitCode: -1}
}

// Write takes raw serial bytes. The serial line turns "\n" into "\r\n";
// carriage returns are dropped. Errors of the live writers are ignored: a
// broken log stream must not kill the guest.
func (c *console) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	clean := bytes.ReplaceAll(p, []byte{'\r'}, nil)
	c.all.Write(clean)
	if c.liveConsole != nil {
		_, _ = c.liveConsole.Write(clean)
	}
	c.partial = append(c.partial, clean...)
	for {
		i := bytes.IndexByte(c.partial, '\n')
		if i < 0 {
			break
		}
		c.line(string(c.partial[:i]), true)
		c.partial = c.partial[i+1:]
	}
	// Keep the partial-line buffer from growing its backing array forever.
	if len(c.partial) == 0 {
		c.partial = nil
	}
	return len(p), nil
}

// flush processes a last line that had no newline.
func (c *console) flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.partial) > 0 {
		c.line(string(c.partial), false)
		c.partial = nil
	}
}

func (c *console) emit(s string) {
	c.out.WriteString(s)
	if c.liveOutput != nil {
		_, _ = io.WriteString(c.liveOutput, s)
	}
}

func (c *console) line(l string, newline bool) {
	switch c.phase {
	case phaseBoot, phaseSetup:
		switch {
		case strings.Contains(l, markKernel) && c.phase == phaseBoot:
			c.kernelVersion = strings.TrimSpace(l[strings.Index(l, markKernel)+len(markKernel):])
			c.bootTime = time.Since(c.start)
			c.phase = phaseSetup
		case strings.Contains(l, markError):
			c.setupErr = strings.TrimSpace(l[strings.Index(l, markError)+len(markError):])
		case strings.HasPrefix(l, markVFIO), strings.HasPrefix(l, markNet):
			c.info = append(c.info, l)
		case strings.Contains(l, markBegin+c.nonce):
			c.phase = phasePayload
		}
	case phasePayload:
		if i := strings.Index(l, markEnd+c.nonce); i >= 0 {
			if i > 0 {
				c.emit(l[:i])
			}
			c.phase = phaseEnded
			return
		}
		if newline {
			l += "\n"
		}
		c.emit(l)
	case phaseEnded:
		switch {
		case strings.HasPrefix(l, markExit):
			if n, err := strconv.Atoi(strings.TrimSpace(l[len(markExit):])); err == nil {
				c.exitCode, c.haveExit = n, true
			}
		case strings.HasPrefix(l, markCollect):
			c.collect = strings.TrimSpace(l[len(markCollect):])
		case strings.HasPrefix(l, markMissing):
			c.missing = append(c.missing, strings.TrimSpace(l[len(markMissing):]))
		case strings.Contains(l, markKlog+c.nonce):
			c.phase = phaseKlog
		}
	case phaseKlog:
		if strings.Contains(l, markKlogE+c.nonce) {
			c.phase = phaseDone
			return
		}
		c.klog.WriteString(l + "\n")
	}
}

// tail returns the last n lines of the console.
func (c *console) tail(n int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := strings.TrimRight(c.all.String(), "\n")
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
