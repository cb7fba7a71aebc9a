package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeQMP serves one QMP connection on m's socket: the greeting, then
// answers each command as answer says, with an event before each reply;
// the commands it saw go to seen.
func fakeQMP(t *testing.T, m *Monitor, answer func(cmd string, args map[string]any) string) <-chan string {
	t.Helper()
	l, err := net.Listen("unix", m.path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	seen := make(chan string, 16)
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = c.Write([]byte(`{"QMP": {"version": {}, "capabilities": []}}` + "\n"))
		rd := bufio.NewReader(c)
		for {
			line, err := rd.ReadBytes('\n')
			if err != nil {
				return
			}
			var req struct {
				Execute   string         `json:"execute"`
				Arguments map[string]any `json:"arguments"`
			}
			if json.Unmarshal(line, &req) != nil {
				return
			}
			seen <- string(line)
			_, _ = c.Write([]byte(`{"event": "NIC_RX_FILTER_CHANGED", "data": {}}` + "\n" + answer(req.Execute, req.Arguments) + "\n"))
		}
	}()
	return seen
}

// TestMonitor: the monitor negotiates capabilities, sends set_link with
// its arguments, skips events, and reports QEMU's error answer as
// ErrMonitor with its description.
func TestMonitor(t *testing.T) {
	m, err := NewMonitor()
	require.NoError(t, err)
	require.Equal(t, []string{"-qmp", "unix:" + m.path + ",server=on,wait=off"}, m.Args())
	seen := fakeQMP(t, m, func(cmd string, args map[string]any) string {
		if cmd == "set_link" && args["name"] != "nic0" {
			return `{"error": {"class": "DeviceNotFound", "desc": "Device 'nic9' not found"}}`
		}
		return `{"return": {}}`
	})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	require.NoError(t, m.SetLink(ctx, "nic0", false))
	require.JSONEq(t, `{"execute":"qmp_capabilities"}`, <-seen)
	require.JSONEq(t, `{"execute":"set_link","arguments":{"name":"nic0","up":false}}`, <-seen)
	err = m.SetLink(ctx, "nic9", true)
	require.ErrorIs(t, err, ErrMonitor)
	require.Contains(t, err.Error(), "Device 'nic9' not found")
	<-seen
	ret, err := m.Execute(ctx, "query-status", nil)
	require.NoError(t, err, "the connection survives QEMU's refusal")
	require.JSONEq(t, `{}`, string(ret))
	require.NoError(t, m.Close())
}

// TestMonitorNoQEMU: with nothing listening, a command fails when its
// context ends, with ErrMonitor.
func TestMonitorNoQEMU(t *testing.T) {
	m, err := NewMonitor()
	require.NoError(t, err)
	defer m.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, m.SetLink(ctx, "nic0", true), ErrMonitor)
}
