package main

import (
	"context"
	"fmt"
	"io"
)

// cmdRun is not built yet; see the issue that introduces it.
func cmdRun(_ context.Context, _ []string, _ io.Reader, _, stderr io.Writer) int {
	fmt.Fprintln(stderr, "connector run: not implemented yet")
	return exitFailure
}
