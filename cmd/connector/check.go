package main

import (
	"context"
	"fmt"
	"io"
)

// cmdCheck is not built yet; see the issue that introduces it.
func cmdCheck(_ context.Context, _ []string, _ io.Reader, _, stderr io.Writer) int {
	fmt.Fprintln(stderr, "connector check: not implemented yet")
	return exitFailure
}
