//go:build !unix

package proccpu

import "time"

// Self returns 0: this system has no getrusage, so CPU time goes
// unmeasured and callers report none.
func Self() time.Duration { return 0 }
