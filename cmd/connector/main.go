// Command connector bridges MQTT 5, NATS and AMQP 0-9-1 topics onto weida
// Pub/Sub endpoints, refusing at configuration time every filter it cannot
// translate exactly. main only wires the process to run; every subcommand
// takes its arguments and streams so that tests can drive it in-process.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"weida.dev/connector/internal/cli"
	"weida.dev/connector/service"
	"weida.dev/connector/weida/weidacli"
)

// Exit codes shared by every subcommand.
const (
	exitOK      = cli.ExitOK
	exitFailure = cli.ExitFailure
	exitUsage   = cli.ExitUsage
)

// version is set at link time (-ldflags "-X main.version=v1.2.3") by
// release builds. Empty, the version recorded in the build information is
// printed instead; see versionLine.
var version string

type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int
}

func commands() []command {
	return []command{
		{"run", "run connectors from resource files", cmdRun},
		{"check", "validate resource files without connecting anywhere", cmdCheck},
		{"explain", "show how a filter or topic converts under a policy", cmdExplain},
		{"schema", "print the JSON Schema of resource files, for editors", cmdSchema},
		{"weida", "talk to weida endpoints directly (sub, pub, bench)", weidacli.Main},
		{"identity", "create an endpoint certificate, or show a certificate's fingerprint", cmdIdentity},
		{"health", "ask a running connector's admin listener whether it is ready", cmdHealth},
		{"version", "print the version and VCS revision of this build", cmdVersion},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		out := stdout
		code := exitOK
		if len(args) == 0 {
			out, code = stderr, exitUsage
		}
		usage(out)
		return code
	}
	if args[0] == "--version" || args[0] == "-version" {
		args = append([]string{"version"}, args[1:]...)
	}
	if args[0] == "demo" {
		// The demo left this binary so that its embedded brokers stay out of
		// production; whoever types the old command learns where it went.
		// It is not in the help, which lists what this binary does.
		fmt.Fprintln(stderr, "connector: the demo is a separate command, without broker code in this binary: go run ./cmd/connector-demo")
		return exitUsage
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run(ctx, args[1:], stdin, stdout, stderr)
		}
	}
	names := make([]string, 0, len(commands()))
	for _, c := range commands() {
		names = append(names, c.name)
	}
	if s := cli.Suggest(args[0], names); s != "" {
		fmt.Fprintf(stderr, "connector: unknown command %q; did you mean %s?\n\n", args[0], s)
	} else {
		fmt.Fprintf(stderr, "connector: unknown command %q\n\n", args[0])
	}
	usage(stderr)
	return exitUsage
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: connector <command> [flags]\n\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun 'connector <command> --help' for a command's flags.")
}

func cmdVersion(_ context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := newFlagSet("version", "connector version", stderr)
	if code, done := parseFlags(fs, args, stdout); done {
		return code
	}
	bi := buildInfo()
	fmt.Fprintln(stdout, versionLine(version, bi))
	if hint := versionHint(version, bi); hint != "" {
		fmt.Fprintln(stderr, hint)
	}
	return exitOK
}

// versionHint explains a build that names no revision, on stderr so that
// the version line stays one line for scripts. The usual cause is not the
// checkout but the go command: -buildvcs=false (often set machine-wide in
// GOFLAGS, as on this project's CI machine) or a linked git worktree leaves
// the VCS data out of the binary, and nothing at run time can recover it.
func versionHint(linked string, bi *debug.BuildInfo) string {
	if bi == nil {
		return ""
	}
	if _, ok := buildSetting(bi, "vcs.revision"); ok || linked != "" || bi.Main.Version != "(devel)" {
		return ""
	}
	return "connector: this build recorded no VCS revision (the go command ran with -buildvcs=false" +
		" or outside a git checkout);" +
		" 'make build' or 'go install -buildvcs=true ./cmd/connector' records it"
}

// versionLine names the build: the version set at link time when there is
// one, else the main module's version from bi. That is the release for a
// binary made by "go install module@version"; for a build from a git
// checkout, a pseudo-version made from the commit (+dirty when modified)
// since Go 1.24, or "(devel)" when the go command recorded no VCS data.
// Then come the VCS revision and whether the tree had uncommitted changes,
// when recorded. bi may be nil when the binary carries no build
// information.
func versionLine(linked string, bi *debug.BuildInfo) string {
	line := "connector " + buildOf(linked, bi).Version
	if bi == nil {
		return line
	}
	for _, key := range []string{"vcs.revision", "vcs.modified"} {
		if v, ok := buildSetting(bi, key); ok {
			line += " " + key + "=" + v
		}
	}
	return line
}

// buildOf is what `connector version` prints, as the fields the admin
// listener exports in weida_connector_build_info: the same reading of the
// link-time version and bi (see versionLine), so that the two always
// agree. bi may be nil.
func buildOf(linked string, bi *debug.BuildInfo) service.Build {
	b := service.Build{Version: linked}
	if bi != nil {
		if b.Version == "" {
			b.Version = bi.Main.Version
		}
		b.Revision, _ = buildSetting(bi, "vcs.revision")
		b.GoVersion = bi.GoVersion
	}
	if b.Version == "" {
		b.Version = "(unknown)"
	}
	return b
}

func buildSetting(bi *debug.BuildInfo, key string) (string, bool) {
	for _, s := range bi.Settings {
		if s.Key == key {
			return s.Value, true
		}
	}
	return "", false
}
