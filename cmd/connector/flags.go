package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// newFlagSet returns a FlagSet that reports errors instead of exiting, so
// every command honours --help and exit code 2 on bad usage.
func newFlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: %s\n\nflags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args. done is true when the caller must return code:
// after --help (printed once, to stdout, exit 0) or a usage error (the error
// and the usage to stderr, exit 2).
func parseFlags(fs *flag.FlagSet, args []string, stdout io.Writer) (code int, done bool) {
	usage := fs.Usage
	fs.Usage = func() {} // flag.Parse would print it itself, to stderr
	err := fs.Parse(args)
	fs.Usage = usage
	if errors.Is(err, flag.ErrHelp) {
		stderr := fs.Output()
		fs.SetOutput(stdout)
		fs.Usage()
		fs.SetOutput(stderr)
		return exitOK, true
	}
	if err != nil {
		fs.Usage()
		return exitUsage, true
	}
	return exitOK, false
}

// stringList is a repeatable string flag (--filter a --filter b).
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }
