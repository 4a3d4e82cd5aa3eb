// Package weidacli is the "connector weida" tool: a weida subscriber (sub),
// a publisher fed from stdin (pub) and a benchmark against raw quic-go
// (bench), for operators who want to look at or feed a weida endpoint
// without writing a resource file. It uses only the weida peer and its
// subpackages, never the bridge runtime, so what it shows is what any weida
// client would see.
package weidacli

import (
	"context"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"weida.dev/connector/internal/cli"
	"weida.dev/connector/weida/topic"
)

const toolUsage = `usage: connector weida <command> [flags]

Talks to weida endpoints directly, without a resource file: look at what a
connector publishes, feed a connector that dials a weida publisher, or
measure what this machine can carry.

commands:
  sub    dial a weida publisher path and print the messages it sends
  pub    host a weida publisher endpoint and publish lines read from stdin
  bench  measure weida against raw quic-go over loopback

Run 'connector weida <command> --help' for a command's flags.

Example, in two shells. Shell 1 hosts the path /sensors and waits for one
subscriber before it reads stdin:

  $ connector weida pub --listen 127.0.0.1:4433 --path /sensors --wait-subscribers 1
  listening on 127.0.0.1:4433, fingerprint sha256:9c1e…
  subscribe with:
    connector weida sub 'weida://sha256:9c1e…@127.0.0.1:4433/sensors' --filter ''

Shell 2 pastes that line, with the filter it wants:

  $ connector weida sub 'weida://sha256:9c1e…@127.0.0.1:4433/sensors' --filter 'sensors.*.temp'

Back in shell 1, type messages, one per line, as JSON or as topic, a TAB,
and the payload:

  {"topic":"sensors.kitchen.temp","payload":"21.5","contentType":"text/plain"}
  sensors.hall.temp	19.0

Shell 1 reports what each line reached ("line 1: sensors.kitchen.temp:
matched 1, queued 1, dropped 0"), and shell 2 prints:

  sensors.kitchen.temp	21.5	content-type=text/plain
  sensors.hall.temp	19.0

End shell 1 with Ctrl-D (end of input), shell 2 with Ctrl-C or --count N.`

// Main runs the tool with args, the arguments after "connector weida"
// (the subcommand first), and returns the process exit status: 0 on
// success, 1 when the command fails, 2 on a usage error. It reads stdin
// only for pub, writes results to stdout and diagnostics to stderr, and
// returns once every goroutine it started has ended, except that pub's
// reader of stdin may stay blocked in stdin.Read until stdin ends. Ending
// ctx interrupts it as Ctrl-C would; each subcommand's --help says what an
// interruption means for its exit status.
func Main(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, toolUsage)
		return cli.ExitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprintln(stdout, toolUsage)
		return cli.ExitOK
	case "sub":
		return cmdSub(ctx, args[1:], stdout, stderr)
	case "pub":
		return cmdPub(ctx, args[1:], stdin, stdout, stderr)
	case "bench":
		return cmdBench(ctx, args[1:], stdout, stderr)
	}
	if s := cli.Suggest(args[0], []string{"sub", "pub", "bench"}); s != "" {
		fmt.Fprintf(stderr, "connector weida: unknown command %q; did you mean %s?\n\n%s\n", args[0], s, toolUsage)
		return cli.ExitUsage
	}
	fmt.Fprintf(stderr, "connector weida: unknown command %q\n\n%s\n", args[0], toolUsage)
	return cli.ExitUsage
}

// parseInterspersed parses flags that may come before, between and after
// positional arguments (connector weida sub URL --filter F), which the
// flag package alone stops at. Everything after "--" is positional. done
// and code are those of cli.ParseFlags: --help prints the usage to stdout
// and gives cli.ExitOK, a bad flag prints the error and the usage to stderr
// and gives cli.ExitUsage.
func parseInterspersed(fs *flag.FlagSet, args []string, stdout io.Writer) (positional []string, code int, done bool) {
	usage := fs.Usage
	fs.Usage = func() {} // flag.Parse calls it on every error; print once, below
	defer func() { fs.Usage = usage }()
	for {
		err := fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stdout)
			usage()
			return nil, cli.ExitOK, true
		}
		if err != nil {
			usage()
			return nil, cli.ExitUsage, true
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return positional, cli.ExitOK, false
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(positional, rest...), cli.ExitOK, false
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// usageError prints a usage error of the named command and returns
// cli.ExitUsage.
func usageError(stderr io.Writer, cmd, format string, a ...any) int {
	fmt.Fprintf(stderr, "connector weida %s: %s\n", cmd, fmt.Sprintf(format, a...))
	fmt.Fprintf(stderr, "Run 'connector weida %s --help' for usage.\n", cmd)
	return cli.ExitUsage
}

// explainFilterError says, in words, which rule of weida's filter grammar
// an input breaks and where.
func explainFilterError(err error) string {
	var fe *topic.FilterError
	if !errors.As(err, &fe) {
		return err.Error()
	}
	var why string
	switch fe.Rule {
	case topic.RuleTooLong:
		why = fmt.Sprintf("longer than %d bytes", topic.MaxLen)
	case topic.RuleInvalidUTF8:
		why = "not valid UTF-8"
	case topic.RuleStarNotAlone:
		why = "'*' must be a whole segment, as in a.*.c"
	case topic.RuleHashNotAlone:
		why = "'#' must be a whole segment, as in a.b.#"
	case topic.RuleHashNotFinal:
		why = "'#' may only be the last segment"
	default:
		why = "breaks the grammar"
	}
	where := ""
	if segs := strings.Split(fe.Filter, "."); fe.Segment >= 0 && fe.Segment < len(segs) {
		where = fmt.Sprintf(" segment %d (%q):", fe.Segment+1, segs[fe.Segment])
	}
	return fmt.Sprintf("%q:%s %s [rule %s]", fe.Filter, where, why, fe.Rule)
}

// safeText returns s as is when it is printable UTF-8 (spaces allowed, no
// tabs or other control characters) and does not start with a double
// quote; otherwise it returns s quoted in Go syntax, so that a printed line
// keeps one field per tab and its meaning.
func safeText(s string) string {
	if isPrintable(s) && !strings.HasPrefix(s, `"`) {
		return s
	}
	return strconv.Quote(s)
}

// payloadMarker prefixes a payload printed in base64.
const payloadMarker = "base64:"

// safePayload returns a payload for a text line, in one of three forms
// told apart by their first bytes: printable UTF-8 as is (unless it starts
// with a double quote or payloadMarker); other valid UTF-8 quoted in Go
// syntax, starting with '"' (a multi-line JSON document stays readable);
// anything else as payloadMarker and its standard base64 encoding.
func safePayload(p []byte) string {
	s := string(p)
	switch {
	case !utf8.ValidString(s):
		return payloadMarker + base64.StdEncoding.EncodeToString(p)
	case isPrintable(s) && !strings.HasPrefix(s, `"`) && !strings.HasPrefix(s, payloadMarker):
		return s
	}
	return strconv.Quote(s)
}

// isPrintable reports whether s is valid UTF-8 made of printable runes and
// ASCII spaces only.
func isPrintable(s string) bool {
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			// A literal U+FFFD is printable, but RuneError from range
			// also stands for an invalid byte; treat both as unsafe.
			return false
		}
	}
	return true
}
