package connectors_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a goroutine outlives them: every
// goroutine a bridge or the runtime starts must be stopped and waited for
// by Run, Stop or Close.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// quic-go's packet handler of a closed transport ends on its
		// own shortly after; the weida package's own tests check it.
		goleak.IgnoreAnyFunction("github.com/quic-go/quic-go.(*Transport).listen"),
	)
}
