package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func runCLI(args ...string) (int, string, string) {
	var out, errw bytes.Buffer
	code := run(args, &out, &errw)
	return code, out.String(), errw.String()
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "usage: vfnic"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"bind"}, "name at least one PCI address"},
		{[]string{"bind", "00:zz.0"}, "bad address"},
		{[]string{"unbind", "0000:00:04.9"}, "bad address"},
		{[]string{"list", "extra"}, "takes no arguments"},
		{[]string{"list", "-nosuchflag"}, "flag provided but not defined"},
		{[]string{"probe"}, "name at least one PCI address"},
		{[]string{"demo", "x"}, "takes no arguments"},
	} {
		code, _, errw := runCLI(tc.args...)
		require.Equal(t, 2, code, "%v: %s", tc.args, errw)
		require.Contains(t, strings.ToLower(errw), strings.ToLower(tc.want), "%v", tc.args)
	}
}

func TestHelp(t *testing.T) {
	code, _, errw := runCLI("help")
	require.Zero(t, code)
	for name := range commands {
		require.Contains(t, errw, name)
	}
	code, _, _ = runCLI("list", "-h")
	require.Zero(t, code)
}

func TestListOnHost(t *testing.T) {
	code, out, errw := runCLI("list", "-all")
	require.Zero(t, code, errw)
	require.Contains(t, out, "ADDRESS")
}

func TestMissingDevice(t *testing.T) {
	code, _, errw := runCLI("bind", "0000:7f:1f.7")
	require.Equal(t, 1, code)
	require.Contains(t, errw, "0000:7f:1f.7")
	require.Contains(t, errw, "not found")
	code, _, errw = runCLI("probe", "0000:7f:1f.7")
	require.Equal(t, 1, code)
	require.Contains(t, errw, "not found")
}
