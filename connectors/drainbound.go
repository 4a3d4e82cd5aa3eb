package connectors

import "time"

// DrainBound returns the drain bound a runtime built with d applies:
// d.Drain, or the default when it is zero. Callers that report the bound
// (the service's stop log) read it here so they never print a zero the
// runtime does not use.
func (d Deps) DrainBound() time.Duration { return d.drain() }
