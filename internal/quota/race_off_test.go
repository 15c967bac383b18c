//go:build !race

package quota_test

// raceOn: the race detector is on, and its instrumentation allocates.
const raceOn = false
