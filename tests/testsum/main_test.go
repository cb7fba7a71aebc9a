package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSummarize(t *testing.T) {
	in := strings.Join([]string{
		`{"Action":"run","Package":"p","Test":"TestA"}`,
		`{"Action":"pass","Package":"p","Test":"TestA","Elapsed":0.1}`,
		`{"Action":"output","Package":"p","Test":"TestVM","Output":"    vm_test.go:1: guest kernel 6.1.0, run took 5s\n"}`,
		`{"Action":"pass","Package":"p","Test":"TestVM/TestGuestX","Elapsed":0}`,
		`{"Action":"pass","Package":"p","Test":"TestVM","Elapsed":5}`,
		`{"Action":"skip","Package":"p","Test":"TestGuestX","Elapsed":0}`,
		`{"Action":"pass","Package":"p","Elapsed":5.2}`,
		`{"Action":"output","Package":"q","Test":"TestB","Output":"boom\n"}`,
		`{"Action":"fail","Package":"q","Test":"TestB","Elapsed":0.3}`,
		`{"Action":"fail","Package":"q","Elapsed":0.4}`,
	}, "\n")
	var w bytes.Buffer
	code := summarize(strings.NewReader(in), &w)
	s := w.String()
	require.Equal(t, 1, code)
	require.Contains(t, s, "ok   p\t5.2s")
	require.Contains(t, s, "FAIL q")
	require.Contains(t, s, "--- PASS: TestVM/TestGuestX")
	require.Contains(t, s, "guest kernel 6.1.0")
	require.Contains(t, s, "boom")
	require.NotContains(t, s, "TestA (", "ordinary passing tests are only counted")
	require.True(t, strings.HasSuffix(s, "3 passed, 1 failed, 1 skipped\n"), s)
}

func TestNoTests(t *testing.T) {
	var w bytes.Buffer
	require.Equal(t, 1, summarize(strings.NewReader(`{"Action":"skip","Package":"p","Elapsed":0}`), &w))
	require.Contains(t, w.String(), "no test ran")
}

func TestBuildFailure(t *testing.T) {
	in := `{"ImportPath":"p","Action":"build-output","Output":"p/x.go:1: syntax error\n"}
{"ImportPath":"p","Action":"build-fail"}
{"Action":"pass","Package":"q","Test":"TestA","Elapsed":0}`
	var w bytes.Buffer
	require.Equal(t, 1, summarize(strings.NewReader(in), &w))
	require.Contains(t, w.String(), "syntax error")
	require.Contains(t, w.String(), "FAIL p [build failed]")
}
