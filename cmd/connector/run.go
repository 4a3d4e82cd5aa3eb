package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

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
}

// cmdRun loads and checks every resource exactly as `check` does, then runs
// them until SIGTERM or SIGINT. Any refusal exits 1 with the diagnostics
// before anything starts. SIGHUP reloads: the files are loaded and checked
// again and, only when all of them are valid, the difference is applied.
func cmdRun(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := newFlagSet("run", "connector run -f PATH [-f PATH...] [--admin ADDR] [--log-format text|json] [--log-level LEVEL] [--instance NAME] [--drain DURATION]", stderr)
	var paths stringList
	fs.Var(&paths, "f", "a resource file, or a directory whose *.yaml and *.yml files are read (not recursively); repeatable")
	admin := fs.String("admin", "127.0.0.1:9090", "address of the admin HTTP listener (/metrics, /healthz, /readyz, /status); empty disables it")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	instance := fs.String("instance", "weida-connector", "loop marker value: messages this connector (or any sharing the value) published are not bridged back")
	drain := fs.Duration("drain", 10*time.Second, "on SIGTERM, how long in-flight messages may take to settle before the process exits")
	if code, done := parseFlags(fs, args, stdout); done {
		return code
	}
	opts := runOptions{paths: paths, admin: *admin, logFormat: *logFormat, instance: *instance, drain: *drain}
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
	}
	if err := opts.logLevel.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(stderr, "connector run: --log-level: %v\n", err)
		return exitUsage
	}
	return runService(ctx, opts, stdout, stderr)
}

func newLogger(w io.Writer, format string, level slog.Level) *slog.Logger {
	ho := &slog.HandlerOptions{Level: level}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, ho))
	}
	return slog.New(slog.NewTextHandler(w, ho))
}

// loadUnits loads, checks and binds the resources. On any refusal it
// returns the check-style diagnostics as the error text.
func loadUnits(paths []string, env service.Env) ([]connectors.Unit, []*resources.Connector, error) {
	set, err := resources.Load(service.Protocols(env.Drivers), paths...)
	if err != nil {
		var b strings.Builder
		writeCheckText(&b, set)
		return nil, nil, errors.New(b.String())
	}
	cs := set.Connectors()
	if len(cs) == 0 {
		return nil, nil, fmt.Errorf("no resources found in %s", strings.Join(paths, ", "))
	}
	for _, d := range set.Documents {
		for _, w := range d.Warnings {
			env.Logger.Warn("resource warning", "resource", w.Resource, "at", w.Position.String(), "field", w.Field, "rule", w.Rule, "msg", w.Message)
		}
	}
	units, err := service.Units(cs, env)
	if err != nil {
		return nil, nil, err
	}
	return units, cs, nil
}

func runService(ctx context.Context, opts runOptions, stdout, stderr io.Writer) int {
	log := newLogger(stderr, opts.logFormat, opts.logLevel)
	env := service.Env{Drivers: drivers(), LoopMarker: opts.instance, Logger: log}

	// SIGHUP is registered before loading so that a reload sent while
	// starting is not lost (nor kills the process, SIGHUP's default).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	units, cs, err := loadUnits(opts.paths, env)
	if err != nil {
		fmt.Fprintf(stderr, "connector run: refusing to start; nothing was started.\n%s\n", err)
		return exitFailure
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := connectors.NewMetrics(reg)
	rt := connectors.NewRuntime(connectors.Deps{Metrics: metrics, Logger: log, Drain: opts.drain})
	reg.MustRegister(rt.Collector())

	var adminSrv *http.Server
	if opts.admin != "" {
		ln, err := net.Listen("tcp", opts.admin)
		if err != nil {
			fmt.Fprintf(stderr, "connector run: admin listener %s: %v; nothing was started.\n", opts.admin, err)
			return exitFailure
		}
		adminSrv = &http.Server{Handler: connectors.AdminHandler(rt, reg), ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := adminSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("admin listener stopped", "err", err)
			}
		}()
		log.Info("admin listener up", "addr", ln.Addr().String())
	}

	if err := rt.Apply(ctx, units); err != nil {
		log.Error("some resources could not start; the others run", "err", err)
	}
	log.Info("connector running", "resources", len(cs), "instance", opts.instance)

	for {
		select {
		case <-ctx.Done():
			log.Info("stopping: draining in-flight messages", "bound", opts.drain.String())
			rt.Stop()
			if adminSrv != nil {
				sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_ = adminSrv.Shutdown(sctx)
				cancel()
			}
			log.Info("stopped")
			return exitOK
		case <-hup:
			reload(ctx, rt, opts, env, log)
		}
	}
}

// reload validates every file again and applies the difference only when
// all of them are valid; otherwise the running set stays as it is.
func reload(ctx context.Context, rt *connectors.Runtime, opts runOptions, env service.Env, log *slog.Logger) {
	log.Info("SIGHUP: reloading resources", "paths", strings.Join(opts.paths, ","))
	units, cs, err := loadUnits(opts.paths, env)
	if err != nil {
		log.Error("reload refused; the running resources are unchanged", "errors", err.Error())
		return
	}
	if err := rt.Apply(ctx, units); err != nil {
		log.Error("reload applied; some resources could not start", "err", err)
		return
	}
	log.Info("reload applied", "resources", len(cs))
}
