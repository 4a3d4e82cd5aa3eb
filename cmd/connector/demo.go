package main

import (
	"context"
	"fmt"
	"io"
)

// cmdDemo is not built yet; see the issue that introduces it.
func cmdDemo(_ context.Context, _ []string, _ io.Reader, _, stderr io.Writer) int {
	fmt.Fprintln(stderr, "connector demo: not implemented yet")
	return exitFailure
}
