package main

import (
	"flag"
	"io"

	"weida.dev/connector/internal/cli"
)

// The flag helpers live in internal/cli, shared with the weida tool; these
// names keep the commands of this package short.

func newFlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	return cli.NewFlagSet(name, synopsis, stderr)
}

func parseFlags(fs *flag.FlagSet, args []string, stdout io.Writer) (code int, done bool) {
	return cli.ParseFlags(fs, args, stdout)
}

// stringList is a repeatable string flag (--filter a --filter b).
type stringList = cli.StringList
