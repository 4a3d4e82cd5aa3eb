package main

import (
	"context"
	"fmt"
	"io"

	"weida.dev/connector/resources"
	"weida.dev/connector/service"
)

// schemaFile is where the repository keeps the output of `connector
// schema`, for editors; a test keeps it current.
const schemaFile = "docs/connector.schema.json"

// cmdSchema prints the JSON Schema of resource files for this build's
// protocols.
func cmdSchema(_ context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := newFlagSet("schema", "connector schema > "+schemaFile, stderr)
	if code, done := parseFlags(fs, args, stdout); done {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "connector schema: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}
	b, err := resources.JSONSchema(service.Protocols(programDrivers()))
	if err != nil {
		fmt.Fprintf(stderr, "connector schema: %v\n", err)
		return exitFailure
	}
	if _, err := stdout.Write(b); err != nil {
		fmt.Fprintf(stderr, "connector schema: %v\n", err)
		return exitFailure
	}
	return exitOK
}
