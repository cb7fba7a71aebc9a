//go:build !(386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm)

package ring

// bigEndian is true: ring fields are little-endian, so loads are swapped.
const bigEndian = true
