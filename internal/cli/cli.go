// Package cli holds the flag handling that every command of the connector
// binary shares, so that each one treats --help, bad flags and exit codes
// the same way whichever package implements it.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// Exit codes of every command.
const (
	ExitOK      = 0 // the command did its work
	ExitFailure = 1 // the command was used correctly and failed
	ExitUsage   = 2 // the arguments were wrong; nothing was attempted
)

// NewFlagSet returns a FlagSet that reports errors instead of exiting and
// whose usage prints synopsis and the flags' defaults, so that every
// command honours --help and exits with [ExitUsage] on bad usage. Errors go
// to stderr; [ParseFlags] sends a requested usage to stdout.
func NewFlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: %s\n\nflags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// ParseFlags parses args with fs, made by [NewFlagSet]. done is true when
// the caller must return code at once: after --help, the usage is printed
// once, to stdout, and code is [ExitOK]; after a bad flag, the error and the
// usage go to fs's output (stderr) and code is [ExitUsage].
func ParseFlags(fs *flag.FlagSet, args []string, stdout io.Writer) (code int, done bool) {
	usage := fs.Usage
	fs.Usage = func() {} // flag.Parse would print it itself, to stderr
	err := fs.Parse(args)
	fs.Usage = usage
	if errors.Is(err, flag.ErrHelp) {
		stderr := fs.Output()
		fs.SetOutput(stdout)
		fs.Usage()
		fs.SetOutput(stderr)
		return ExitOK, true
	}
	if err != nil {
		fs.Usage()
		return ExitUsage, true
	}
	return ExitOK, false
}

// StringList is a repeatable string flag (--filter a --filter b); it
// collects the values in the order given.
type StringList []string

// String joins the values with commas, for flag's defaults.
func (s *StringList) String() string { return strings.Join(*s, ",") }

// Set appends v.
func (s *StringList) Set(v string) error { *s = append(*s, v); return nil }
