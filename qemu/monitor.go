package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// ErrMonitor means a QEMU monitor (QMP) command failed: QEMU refused it,
// or the monitor could not be reached or spoke something else than QMP.
var ErrMonitor = errors.New("qemu: monitor command failed")

// Monitor is a QMP (QEMU Machine Protocol) connection to a guest's QEMU,
// for what a test does to a running guest from outside: take a NIC's link
// down and up (SetLink), or any other command (Execute). Put it in
// Config.Monitor before Run: QEMU then listens on its socket, and the
// Monitor connects at its first command, while the guest runs.
// Commands are serialized; Close drops the connection and the socket.
type Monitor struct {
	dir, path string

	mu   sync.Mutex
	conn net.Conn
	rd   *bufio.Reader
}

// NewMonitor makes a monitor with its socket in a new temporary directory.
func NewMonitor() (*Monitor, error) {
	dir, err := os.MkdirTemp("", "vfnic-qmp-")
	if err != nil {
		return nil, fmt.Errorf("qemu: monitor directory: %w", err)
	}
	return &Monitor{dir: dir, path: filepath.Join(dir, "qmp.sock")}, nil
}

// Args are the QEMU arguments that serve the monitor's socket (without
// waiting for a client: the guest boots whether or not one connects).
func (m *Monitor) Args() []string {
	return []string{"-qmp", "unix:" + m.path + ",server=on,wait=off"}
}

// Close closes the connection and removes the socket's directory.
func (m *Monitor) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var err error
	if m.conn != nil {
		err = m.conn.Close()
		m.conn, m.rd = nil, nil
	}
	return errors.Join(err, os.RemoveAll(m.dir))
}

// SetLink sets the link of a NIC or netdev (QEMU's set_link): name is the
// NIC's device id ("nic0" for Config.NICs[0]) or a netdev id. A NIC whose
// link is down sends and receives nothing, and its model reports the
// link down to the guest (for igb, STATUS.LU and ICR.LSC).
func (m *Monitor) SetLink(ctx context.Context, name string, up bool) error {
	_, err := m.Execute(ctx, "set_link", map[string]any{"name": name, "up": up})
	return err
}

// Execute runs one QMP command with its arguments (nil for none) and
// returns its "return" value. It connects first if it has not yet,
// retrying until QEMU listens or ctx ends. Asynchronous events QEMU sends
// in between are skipped.
func (m *Monitor) Execute(ctx context.Context, cmd string, args any) (json.RawMessage, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.conn == nil {
		if err := m.connect(ctx); err != nil {
			return nil, err
		}
	}
	ret, err := m.exec(ctx, cmd, args)
	if err != nil && !errors.Is(err, errQMPRefused) {
		// The stream may be out of step: connect afresh next time.
		_ = m.conn.Close()
		m.conn, m.rd = nil, nil
	}
	return ret, err
}

// errQMPRefused marks QEMU's own error answer (the connection is fine).
var errQMPRefused = errors.New("refused")

// connect dials the socket, reads the greeting and leaves capabilities
// negotiation mode. Called locked.
func (m *Monitor) connect(ctx context.Context) error {
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "unix", m.path)
		if err == nil {
			m.conn, m.rd = c, bufio.NewReader(c)
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: connect %s: %v (%w)", ErrMonitor, m.path, err, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	var greeting struct {
		QMP json.RawMessage `json:"QMP"`
	}
	if err := m.readLine(ctx, &greeting); err != nil || greeting.QMP == nil {
		_ = m.conn.Close()
		m.conn, m.rd = nil, nil
		return fmt.Errorf("%w: no QMP greeting on %s (%v)", ErrMonitor, m.path, err)
	}
	if _, err := m.exec(ctx, "qmp_capabilities", nil); err != nil {
		_ = m.conn.Close()
		m.conn, m.rd = nil, nil
		return err
	}
	return nil
}

// qmpReply is one line from QEMU: a command's return or error, or an
// event.
type qmpReply struct {
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
	Event string `json:"event"`
}

// exec sends one command and reads until its answer. Called locked.
func (m *Monitor) exec(ctx context.Context, cmd string, args any) (json.RawMessage, error) {
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: arguments: %v", ErrMonitor, cmd, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = m.conn.SetDeadline(dl)
	} else {
		_ = m.conn.SetDeadline(time.Time{})
	}
	if _, err := m.conn.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrMonitor, cmd, err)
	}
	for {
		var r qmpReply
		if err := m.readLine(ctx, &r); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrMonitor, cmd, err)
		}
		switch {
		case r.Event != "":
			continue
		case r.Error != nil:
			return nil, fmt.Errorf("%w: %s: %w: %s: %s", ErrMonitor, cmd, errQMPRefused, r.Error.Class, r.Error.Desc)
		case r.Return != nil:
			return r.Return, nil
		}
		return nil, fmt.Errorf("%w: %s: a reply with neither return nor error", ErrMonitor, cmd)
	}
}

// readLine decodes one JSON line. Called locked.
func (m *Monitor) readLine(ctx context.Context, v any) error {
	if dl, ok := ctx.Deadline(); ok {
		_ = m.conn.SetReadDeadline(dl)
	}
	line, err := m.rd.ReadBytes('\n')
	if err != nil {
		return err
	}
	return json.Unmarshal(line, v)
}
