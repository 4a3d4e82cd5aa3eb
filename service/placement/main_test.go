package placement

import (
	"testing"

	"go.uber.org/goleak"
)

// Every Holding and Placer owns goroutines that must end with it.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
