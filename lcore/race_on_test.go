//go:build race

package lcore

const raceEnabled = true
