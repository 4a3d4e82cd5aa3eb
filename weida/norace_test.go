//go:build !race

package weida

const raceEnabled = false
