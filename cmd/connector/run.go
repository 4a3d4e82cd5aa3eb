package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"weida.dev/connector/connectors"
	"weida.dev/connector/resources"
	"weida.dev/connector/service"
)

// runOptions are the flags of `connector run`.
type runOptions struct {
	paths     []string
	admin     string
	logFormat string
	logLevel  slog.Level
	instance  string
	drain     time.Duration
	retry     connectors.Backoff
	stateDir  string // "" when none could be chosen
	watch     bool
	pprof     bool
	// adminTokenFile is --admin-token-file; "" serves the admin
	// listener without authentication.
	adminTokenFile string
	placement      service.Placement
	// resetKeyFile is --reset-key-file, checked; "" : the key is kept in
	// the state directory.
	resetKeyFile string
}

// cmdRun loads and checks every resource exactly as `check` does, then runs
// them until SIGTERM or SIGINT. Any refusal exits 1 with the diagnostics
// before anything starts. SIGHUP reloads: the files are loaded and checked
// again and, only when all of them are valid, the difference is applied.
// With --watch, a change to the files does the same, without a signal.
func cmdRun(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := newFlagSet("run", "connector run -f PATH [-f PATH...] [--admin ADDR] [--log-format text|json] [--log-level LEVEL] [--instance NAME] [--drain DURATION] [--retry-initial DURATION] [--retry-max DURATION] [--state-dir DIR] [--watch] [--admin-token-file PATH] [--pprof] [--placement etcd|kubernetes --replica-id ID (--etcd-endpoints URLS | --lease-namespace NS) ...]", stderr)
	var paths stringList
	fs.Var(&paths, "f", "a resource file, or a directory whose *.yaml and *.yml files are read (not recursively); repeatable")
	admin := fs.String("admin", "127.0.0.1:9090", "address of the admin HTTP listener (/metrics, /healthz, /readyz, /status); empty disables it")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	instance := fs.String("instance", "weida-connector", "loop marker value: messages this connector (or any sharing the value) published are not bridged back")
	drain := fs.Duration("drain", 10*time.Second, "on SIGTERM, how long in-flight messages may take to settle before the process exits")
	retryInitial := fs.Duration("retry-initial", 250*time.Millisecond, "the shortest wait before a failed resource is tried again")
	retryMax := fs.Duration("retry-max", 10*time.Second, "the longest wait between two attempts of a failed resource (waits double up to it, with jitter)")
	stateDir := fs.String("state-dir", "", "where hosted endpoints without certFile/keyFile keep their generated identity, so that its fingerprint survives restarts "+
		"(default: $STATE_DIRECTORY, else "+systemStateDir+" when writable, else $XDG_STATE_HOME/weida-connector or ~/.local/state/weida-connector)")
	watch := fs.Bool("watch", false, "reload when the resource files change (an edit, or a Kubernetes ConfigMap update), as SIGHUP does")
	adminTokenFile := fs.String("admin-token-file", "", "a file holding a token the admin listener asks for on every path but the probes (/healthz, /readyz): "+
		"Authorization: Bearer TOKEN, or HTTP Basic with the token as password; read again when the file changes")
	pprof := fs.Bool("pprof", false, "serve Go's profiles (net/http/pprof) under /debug/pprof/ on the admin listener; "+
		"beyond loopback only with --admin-token-file")
	placementFlags := addPlacementFlags(fs)
	if code, done := parseFlags(fs, args, stdout); done {
		return code
	}
	pl, perr := placementFlags.placement(os.Hostname)
	if perr != nil {
		fmt.Fprintf(stderr, "connector run: %v\n", perr)
		return exitUsage
	}
	resetKeyFile, rerr := placementFlags.resetKey()
	if rerr != nil {
		fmt.Fprintf(stderr, "connector run: refusing to start; nothing was started: %v\n", rerr)
		return exitUsage
	}
	opts := runOptions{placement: pl, pprof: *pprof, adminTokenFile: *adminTokenFile, paths: paths, admin: *admin, logFormat: *logFormat, instance: *instance, drain: *drain,
		retry: connectors.Backoff{Initial: *retryInitial, Max: *retryMax}, stateDir: *stateDir, watch: *watch, resetKeyFile: resetKeyFile}
	stateSource := "--state-dir"
	if opts.stateDir == "" {
		opts.stateDir, stateSource = defaultStateDir(os.Getenv, writableDir)
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "connector run: unexpected argument %q; name resource files with -f\n", fs.Arg(0))
		return exitUsage
	case len(paths) == 0:
		fmt.Fprintln(stderr, "connector run: no resources named; use -f FILE or -f DIRECTORY")
		return exitUsage
	case opts.logFormat != "text" && opts.logFormat != "json":
		fmt.Fprintf(stderr, "connector run: --log-format must be text or json, not %q\n", opts.logFormat)
		return exitUsage
	case opts.drain <= 0:
		fmt.Fprintln(stderr, "connector run: --drain must be positive")
		return exitUsage
	case opts.retry.Initial <= 0 || opts.retry.Max < opts.retry.Initial:
		fmt.Fprintln(stderr, "connector run: --retry-initial must be positive and no longer than --retry-max")
		return exitUsage
	}
	level, ok := parseLevel(*logLevel)
	if !ok {
		fmt.Fprintf(stderr, "connector run: --log-level must be debug, info, warn or error, not %q\n", *logLevel)
		return exitUsage
	}
	opts.logLevel = level
	return runService(ctx, opts, stateSource, stdout, stderr)
}

// parseLevel reads the four levels --log-level documents, in any case.
// slog's own parser also takes offsets ("info+2"), which the flag does not
// promise.
func parseLevel(s string) (slog.Level, bool) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, true
	case "info":
		return slog.LevelInfo, true
	case "warn":
		return slog.LevelWarn, true
	case "error":
		return slog.LevelError, true
	}
	return 0, false
}

func newLogger(w io.Writer, format string, level slog.Level) *slog.Logger {
	ho := &slog.HandlerOptions{Level: level}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, ho))
	}
	return slog.New(slog.NewTextHandler(w, ho))
}

// buildInfo is this binary's build information, or nil when it carries
// none.
func buildInfo() *debug.BuildInfo {
	bi, _ := debug.ReadBuildInfo()
	return bi
}

func runService(ctx context.Context, opts runOptions, stateSource string, stdout, stderr io.Writer) int {
	log := newLogger(stderr, opts.logFormat, opts.logLevel)
	if opts.stateDir == "" {
		log.Warn("no state directory: hosted endpoints without certFile/keyFile get a new fingerprint at every start; set --state-dir")
	} else {
		log.Info("state directory", "dir", opts.stateDir, "from", stateSource)
	}
	if msg, attrs := drainWarning(opts.drain, opts.placement); msg != "" {
		log.Warn(msg, attrs...)
	}

	// SIGHUP is registered before loading so that a reload sent while
	// starting is not lost (nor kills the process, SIGHUP's default).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	err := service.Run(ctx, service.Config{
		Env:            service.Env{Drivers: programDrivers(), LoopMarker: opts.instance, Logger: log, StateDir: opts.stateDir, ResetKeyFile: opts.resetKeyFile},
		Paths:          opts.paths,
		Admin:          opts.admin,
		Drain:          opts.drain,
		Retry:          opts.retry,
		Watch:          opts.watch,
		Pprof:          opts.pprof,
		AdminTokenFile: opts.adminTokenFile,
		Build:          buildOf(version, buildInfo()),
		Placement:      opts.placement,
		Describe: func(set *resources.Set) string {
			var b strings.Builder
			writeCheckText(&b, set)
			return b.String()
		},
	}, hup)
	var le *service.LoadError
	var ae *service.AdminError
	switch {
	case errors.As(err, &le):
		fmt.Fprintf(stderr, "connector run: refusing to start; nothing was started.\n%s\n"+
			"Correct the files and start again: `connector check -f PATH` lists every fault without starting anything. "+
			"The connector does not fall back to an older set: a file refused here was also refused by any reload "+
			"of a running connector, which kept running the set it had (see lastReload in /status).\n", le.Text)
		return exitFailure
	case errors.As(err, &ae):
		fmt.Fprintf(stderr, "connector run: %v; nothing was started.\n", ae)
		return exitFailure
	case err != nil:
		fmt.Fprintf(stderr, "connector run: %v\n", err)
		return exitFailure
	}
	return exitOK
}
