package main

import (
	"context"
	"fmt"
	"io"
)

// cmdExplain is not built yet; see the issue that introduces it.
func cmdExplain(_ context.Context, _ []string, _ io.Reader, _, stderr io.Writer) int {
	fmt.Fprintln(stderr, "connector explain: not implemented yet")
	return exitFailure
}
