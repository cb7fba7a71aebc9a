package initramfs

import (
	"compress/gzip"
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

func writeGzip(t *testing.T, w io.Writer, s string) {
	t.Helper()
	zw := gzip.NewWriter(w)
	_, err := zw.Write([]byte(s))
	require.NoError(t, err)
	require.NoError(t, zw.Close())
}
