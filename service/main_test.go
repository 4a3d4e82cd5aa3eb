package service_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when any goroutine outlives them: a
// Run that returned, a stopped runtime or a closed watcher must leave
// nothing behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
