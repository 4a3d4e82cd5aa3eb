package main

import (
	"context"
	"fmt"
	"io"
)

// cmdWeida is not built yet; see the issue that introduces it.
func cmdWeida(_ context.Context, _ []string, _ io.Reader, _, stderr io.Writer) int {
	fmt.Fprintln(stderr, "connector weida: not implemented yet")
	return exitFailure
}
