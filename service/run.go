package service

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	httppprof "net/http/pprof"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"weida.dev/connector/connectors"
	"weida.dev/connector/resources"
	"weida.dev/connector/service/admin"
)

// LoadError is returned when resources cannot run: some are invalid, none
// were found, or a secret cannot be read. Nothing was started.
type LoadError struct {
	// Set is what was loaded; nil when loading itself succeeded and
	// building the units failed.
	Set *resources.Set
	// Text is the diagnostics, one or more lines, for an operator.
	Text string
	Err  error
}

func (e *LoadError) Error() string { return e.Text }
func (e *LoadError) Unwrap() error { return e.Err }

// Load loads and checks the resources of paths with env's drivers, logs
// their warnings and builds their units. describe renders a refused set
// for [LoadError.Text] (`connector check`'s text); nil uses the set's
// joined errors.
func Load(paths []string, env Env, describe func(*resources.Set) string) ([]connectors.Unit, []*resources.Connector, error) {
	set, err := resources.Load(Protocols(env.Drivers), paths...)
	if err != nil {
		text := err.Error()
		if describe != nil {
			text = describe(set)
		}
		return nil, nil, &LoadError{Set: set, Text: text, Err: err}
	}
	cs := set.Connectors()
	if len(cs) == 0 {
		return nil, nil, &LoadError{Set: set, Text: "no resources found in " + strings.Join(paths, ", ")}
	}
	for _, d := range set.Documents {
		for _, w := range d.Warnings {
			env.logger().Warn("resource warning", "resource", w.Resource, "at", w.Position.String(), "field", w.Field, "rule", w.Rule, "msg", w.Message)
		}
	}
	units, err := Units(cs, env)
	if err != nil {
		return nil, nil, &LoadError{Text: err.Error(), Err: err}
	}
	return units, cs, nil
}

// Config configures [Run].
type Config struct {
	Env
	// Paths are the resource files and directories.
	Paths []string
	// Admin is the address of the admin HTTP listener (/metrics,
	// /healthz, /readyz, /status); "" disables it.
	Admin string
	// Drain bounds how long in-flight messages may take to settle when
	// ctx ends; zero means the runtime's default.
	Drain time.Duration
	// Retry bounds the jittered backoff between attempts of a failed
	// resource; the zero value means the runtime's default.
	Retry connectors.Backoff
	// Describe renders a refused set (see [Load]).
	Describe func(*resources.Set) string
	// Watch makes Run reload when the files of Paths change, as it does
	// for a value from its reload channel (see [Watcher]).
	Watch bool
	// WatchDebounce is [WatchOptions.Debounce] when Watch is set.
	WatchDebounce time.Duration
	// AdminTokenFile, when not empty, is a file holding the admin
	// listener's token: every path but the probes then asks for it (see
	// [admin.RequireToken]), and it is read again when the file changes.
	// "" serves every path to whoever reaches the listener.
	AdminTokenFile string
	// Pprof serves net/http/pprof's profiles under /debug/pprof/ on the
	// admin listener. They show the program's insides (goroutine stacks,
	// command line) and a CPU profile costs CPU while it runs, so they
	// are off unless asked for, and Run refuses them on a listener
	// reachable beyond loopback unless AdminTokenFile protects them.
	Pprof bool
	// Build names the running build in the weida_connector_build_info
	// series of /metrics.
	Build Build
	// Placement shares the resources among replicas through leases (see
	// placed.go); its zero value runs every resource here.
	Placement Placement
}

// Build names a build of the program, as `connector version` prints it.
type Build struct {
	// Version is the release or module version; empty is exported as
	// "(unknown)".
	Version string
	// Revision is the VCS revision the build was made from; empty when
	// none was recorded.
	Revision string
	// GoVersion is the Go toolchain that built it; empty means
	// runtime.Version() of the running process.
	GoVersion string
}

// collector returns the constant weida_connector_build_info series:
// value 1, the build in its labels, so that dashboards can join on it.
func (b Build) collector() prometheus.Collector {
	if b.Version == "" {
		b.Version = "(unknown)"
	}
	if b.GoVersion == "" {
		b.GoVersion = runtime.Version()
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace:   "weida_connector",
		Name:        "build_info",
		Help:        "Always 1; the labels name the running build (version, VCS revision, Go version).",
		ConstLabels: prometheus.Labels{"version": b.Version, "revision": b.Revision, "goversion": b.GoVersion},
	})
	g.Set(1)
	return g
}

// AdminError is returned by [Run] when the admin listener cannot listen,
// its token file holds no usable token, or it would serve pprof beyond
// loopback without one. Nothing was started.
type AdminError struct {
	Addr string
	Err  error
}

func (e *AdminError) Error() string { return fmt.Sprintf("admin listener %s: %v", e.Addr, e.Err) }
func (e *AdminError) Unwrap() error { return e.Err }

// Run loads the resources and runs them until ctx ends, then drains and
// returns nil. Each value received from reload (SIGHUP, for the command),
// and with cfg.Watch each settled change of the files, loads the files
// again and, only when all of them are valid, applies the difference;
// otherwise the running set stays as it is. Before anything starts, a
// refusal returns a [*LoadError], a busy admin address an [*AdminError]
// and a path that cannot be watched the watcher's error. A resource that
// cannot start (its listen address is taken, say) is logged and the others
// run.
//
// Its body is the lifecycle in the order it happens (load, watch, metrics,
// placement, admin listener, start, the reload loop, stop); each step is a
// call, and what remains long is their sequence.
func Run[T any](ctx context.Context, cfg Config, reload <-chan T) error {
	log := cfg.logger()
	units, cs, err := Load(cfg.Paths, cfg.Env, cfg.Describe)
	if err != nil {
		return err
	}

	// Watching starts before the resources do, so that a change made
	// while they start is not missed.
	var changes <-chan struct{}
	if cfg.Watch {
		w, err := NewWatcher(cfg.Paths, WatchOptions{Debounce: cfg.WatchDebounce, Logger: log})
		if err != nil {
			return err
		}
		defer w.Close()
		changes = w.Changes()
		log.Info("watching resource files for changes", "paths", strings.Join(cfg.Paths, ","))
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		cfg.Build.collector())
	metrics := connectors.NewMetrics(reg)
	deps := connectors.Deps{Metrics: metrics, Logger: log, Drain: cfg.Drain}
	if cfg.Retry.Initial > 0 {
		deps.Backoff = cfg.Retry.Wait
	}
	rt := connectors.NewRuntime(deps)
	reg.MustRegister(rt.Collector())
	started := time.Now()
	history := newReloads(reg, started, time.Now)
	// loaded is what /readyz answers: true from the first Apply until
	// ctx ends, so that a stopping pod leaves its Services first.
	var loaded atomic.Bool
	var view admin.Runtime = rt
	var pl *placed
	if cfg.Placement.Enabled() {
		if pl, err = newPlaced(cfg, rt, units, reg); err != nil {
			return err
		}
		view = pl
	}

	opts := admin.Options{
		Version: cfg.Build.Version, Instance: cfg.LoopMarker, Started: started,
		Loaded: loaded.Load, LastReload: history.Last,
	}
	adminServer, serving, err := serveAdmin(cfg, view, reg, opts)
	if err != nil {
		if pl != nil {
			pl.close()
		}
		return err
	}

	if pl != nil {
		if err := pl.start(); err != nil {
			return err
		}
	} else if err := rt.Apply(ctx, units); err != nil {
		log.Error("some resources could not start; the others run", "err", err)
	}
	loaded.Store(true)
	log.Info("connector running", "resources", len(cs), "instance", cfg.LoopMarker)

	for {
		select {
		case <-ctx.Done():
			loaded.Store(false)
			log.Info("stopping: draining in-flight messages", "bound", deps.DrainBound().String())
			if pl != nil {
				pl.Close() // stops what it holds, then releases every lease
			}
			rt.Stop()
			if adminServer != nil {
				sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_ = adminServer.Shutdown(sctx)
				cancel()
				serving.Wait()
			}
			log.Info("stopped")
			return nil
		case <-reload:
			reloadBy(ctx, rt, pl, cfg, history, "signal")
		case <-changes:
			log.Info("resource files changed")
			reloadBy(ctx, rt, pl, cfg, history, "watch")
		}
	}
}

// adminHandler is [admin.Handler], with net/http/pprof's
// handlers under /debug/pprof/ when pprof is set.
func adminHandler(rt admin.Runtime, g prometheus.Gatherer, o admin.Options, pprof bool) http.Handler {
	h := admin.Handler(rt, g, o)
	if !pprof {
		return h
	}
	mux := http.NewServeMux()
	mux.Handle("/", h)
	mux.HandleFunc("/debug/pprof/", httppprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", httppprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", httppprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", httppprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", httppprof.Trace)
	return mux
}

// Reload loads cfg's files again and applies them to rt when every
// resource is valid; otherwise it logs why and leaves rt as it is.
func Reload(ctx context.Context, rt *connectors.Runtime, cfg Config) {
	reloadOnce(ctx, rt, cfg, nil, "")
}

// serveAdmin starts the admin listener when cfg names one: it returns the
// server (nil without one) and the group its Serve runs in, or an
// [*AdminError] when the address cannot be bound, the token file holds no
// usable token, or pprof would be served beyond loopback without a token.
func serveAdmin(cfg Config, view admin.Runtime, reg *prometheus.Registry, opts admin.Options) (*http.Server, *sync.WaitGroup, error) {
	var serving sync.WaitGroup
	if cfg.Admin == "" {
		return nil, &serving, nil
	}
	log := cfg.logger()
	var token *admin.TokenFile
	if cfg.AdminTokenFile != "" {
		var err error
		if token, err = admin.OpenTokenFile(cfg.AdminTokenFile, log); err != nil {
			return nil, &serving, &AdminError{Addr: cfg.Admin, Err: err}
		}
		opts.TokenRequired = true
	}
	ln, err := net.Listen("tcp", cfg.Admin)
	if err != nil {
		return nil, &serving, &AdminError{Addr: cfg.Admin, Err: err}
	}
	// Judged on the bound address, not the flag's text: "localhost:9090"
	// binds loopback, ":9090" and a host name of this machine do not.
	local := loopbackOnly(ln.Addr())
	if cfg.Pprof && token == nil && !local {
		_ = ln.Close()
		return nil, &serving, &AdminError{Addr: cfg.Admin, Err: ErrPprofExposed}
	}
	h := adminHandler(view, reg, opts, cfg.Pprof)
	if token != nil {
		h = admin.RequireToken(h, token)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	serving.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("admin listener stopped", "err", err)
		}
	})
	log.Info("admin listener up", "addr", ln.Addr().String(), "token_required", token != nil)
	if !local && token == nil {
		log.Warn("the admin listener is reachable beyond this host: it serves /metrics, /status and the status page "+
			"without authentication; set --admin-token-file to ask for a token on everything but the probes, "+
			"or bind it to 127.0.0.1 unless a network policy or a proxy restricts who reaches it", "addr", cfg.Admin, "bound", ln.Addr().String())
	}
	return srv, &serving, nil
}

// ErrPprofExposed, in an [*AdminError], refuses a start that would serve
// pprof's profiles (goroutine stacks, the command line, CPU on demand) to
// anyone who reaches a listener beyond loopback.
var ErrPprofExposed = errors.New("--pprof on an admin listener reachable beyond this host needs --admin-token-file " +
	"(a file holding a token that pprof and everything but the probes then ask for), or --admin on 127.0.0.1")

// reloadBy reloads the files for trigger: through the placement when the
// replica places its resources by lease, straight into rt otherwise.
func reloadBy(ctx context.Context, rt *connectors.Runtime, pl *placed, cfg Config, history *reloads, trigger string) {
	if pl != nil {
		pl.Reload(history, trigger)
		return
	}
	reloadOnce(ctx, rt, cfg, history, trigger)
}

// reloadOnce is [Reload], recording the outcome in history (when not nil)
// as asked for by trigger.
func reloadOnce(ctx context.Context, rt *connectors.Runtime, cfg Config, history *reloads, trigger string) {
	log := cfg.logger()
	t := time.Now()
	log.Info("reloading resources", "paths", strings.Join(cfg.Paths, ","), "trigger", trigger)
	units, cs, err := Load(cfg.Paths, cfg.Env, cfg.Describe)
	if err != nil {
		log.Error("reload refused; the running resources are unchanged: correct the files (connector check -f lists every fault) and reload again",
			"errors", err.Error())
		if history != nil {
			history.record(t, trigger, err.Error(), "")
		}
		return
	}
	err = rt.Apply(ctx, units)
	if history != nil {
		var startErrs string
		if err != nil {
			startErrs = err.Error()
		}
		history.record(t, trigger, "", startErrs)
	}
	if err != nil {
		log.Error("reload applied; some resources could not start", "err", err)
		return
	}
	log.Info("reload applied", "resources", len(cs))
}

// loopbackOnly reports whether addr is a loopback address: a wildcard
// (0.0.0.0, ::) or any other address is reachable from elsewhere.
func loopbackOnly(addr net.Addr) bool {
	ta, ok := addr.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}
