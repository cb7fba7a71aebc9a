// Package bench holds the completion-path benchmark that compares vfnic's
// Go read path (cq.CQ.Read over cq/qpsim's ring layout, in goreader) with a
// C reference (c/reader.c) on the same ring written by the same C producer
// (c/producer.c). run.sh builds and runs it and prints the table; the test
// in this package checks, with small counts, that both readers see the
// same completions in the same order. See README.md.
package bench
