package connectors

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"weida.dev/connector/weida"
)

// listeners are the weida listeners of a runtime's inbound resources, one
// per listen address, shared by the resources on it: each counts the
// publisher paths it serves and closes with the last, unless a reload keeps
// it for the resources it restarts. Its methods are safe for concurrent use.
type listeners struct {
	log *slog.Logger

	mu     sync.Mutex
	byAddr map[string]*sharedListener
}

type sharedListener struct {
	l    *weida.Listener
	cfg  weida.ListenConfig
	refs int // publisher paths held on it
	// resources names the resource holding each path, for the scope
	// metrics, which the listener counts by path.
	resources map[string]string
}

// hostedPath is one publisher path an inbound bridge holds on a shared
// listener.
type hostedPath struct {
	pub    *weida.Publisher
	l      *weida.Listener
	listen string
}

func newListeners(log *slog.Logger) *listeners {
	return &listeners{log: log, byAddr: make(map[string]*sharedListener)}
}

// acquire hosts path for resource on the listener of listen, starting it
// with cfg when none serves the address yet, and restricts the path's
// subscriptions to scopes (nil: no restriction). On a listener kept
// across a reload, the new scopes replace the previous resource's, and
// the subscriptions they no longer cover are dropped (weida's SetScopes).
func (ls *listeners) acquire(ctx context.Context, listen, path string, cfg weida.ListenConfig, scopes weida.Scopes, resource string) (*hostedPath, error) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	sl := ls.byAddr[listen]
	if sl == nil {
		lc := cfg
		if lc.Logger == nil {
			lc.Logger = ls.log.With("listen", listen)
		}
		l, err := weida.Listen(ctx, listen, lc)
		if err != nil {
			return nil, fmt.Errorf("weida listen %s: %w", listen, err)
		}
		ls.log.Info("weida listener up", "listen", l.Addr().String(), "fingerprint", l.Fingerprint())
		sl = &sharedListener{l: l, cfg: cfg, resources: make(map[string]string)}
		ls.byAddr[listen] = sl
	} else if !sameListenIdentity(sl.cfg, cfg) {
		return nil, fmt.Errorf("weida listen %s: already serving other resources with a different certificate or client allowlist", listen)
	}
	pub, err := sl.l.Publisher(path)
	if err == nil {
		// After Publisher, so that a path held by another resource keeps
		// its scopes; before the bridge has the publisher, so that
		// nothing is published or replayed under the previous ones.
		if err = sl.l.SetScopes(path, scopes); err != nil {
			pub.Close()
		}
	}
	if err != nil {
		if sl.refs == 0 {
			sl.l.Close()
			delete(ls.byAddr, listen)
		}
		return nil, fmt.Errorf("weida publisher %s%s: %w", listen, path, err)
	}
	sl.refs++
	sl.resources[path] = resource
	ls.log.Info("weida endpoint hosted", "resource", resource, "subscriberURL", subscriberURL(listen, path, sl.l))
	return &hostedPath{pub: pub, l: sl.l, listen: listen}, nil
}

// release closes h's publisher path and gives up its listener, which
// shuts down with its last path, within drain, unless keep holds the
// address with the same identity (a reload restarting the resources on
// it). The copies still queued were acknowledged to the broker, and the
// resource may go on elsewhere (another replica took its lease), so they
// get the drain bound to be written, as at the process's own shutdown.
func (ls *listeners) release(h *hostedPath, keep map[string]weida.ListenConfig, drain time.Duration) {
	h.pub.Close()
	ls.mu.Lock()
	sl := ls.byAddr[h.listen]
	if sl == nil {
		ls.mu.Unlock()
		return
	}
	sl.refs--
	delete(sl.resources, h.pub.Path())
	if cfg, ok := keep[h.listen]; ok && sameListenIdentity(sl.cfg, cfg) {
		ls.mu.Unlock()
		return
	}
	last := sl.refs == 0
	if last {
		delete(ls.byAddr, h.listen)
	}
	ls.mu.Unlock()
	if last {
		ctx, cancel := context.WithTimeout(context.Background(), drain)
		defer cancel()
		_ = sl.l.Shutdown(ctx)
	}
}

// lookup returns the listener serving listen, or nil.
func (ls *listeners) lookup(listen string) *weida.Listener {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if sl := ls.byAddr[listen]; sl != nil {
		return sl.l
	}
	return nil
}

// closeUnused closes the listeners no path holds: one a reload kept for a
// resource that then failed to start serves nobody.
func (ls *listeners) closeUnused() {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for addr, sl := range ls.byAddr {
		if sl.refs == 0 {
			sl.l.Close()
			delete(ls.byAddr, addr)
		}
	}
}

// stats returns each listener's counters, by address, and the resource
// holding each path, by address and path.
func (ls *listeners) stats() (map[string]weida.ListenerStats, map[string]map[string]string) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	st := make(map[string]weida.ListenerStats, len(ls.byAddr))
	held := make(map[string]map[string]string, len(ls.byAddr))
	for addr, sl := range ls.byAddr {
		st[addr] = sl.l.Stats()
		held[addr] = maps.Clone(sl.resources)
	}
	return st, held
}

// shutdown shuts every listener down, each within drain, and forgets them.
// The copies still queued for subscribers were acknowledged to their
// brokers: they get the drain bound to be written, and those that were not
// are logged, since no series is left to count them once the process ends.
func (ls *listeners) shutdown(drain time.Duration) {
	ls.mu.Lock()
	all := ls.byAddr
	ls.byAddr = make(map[string]*sharedListener)
	ls.mu.Unlock()
	var wg sync.WaitGroup
	for addr, sl := range all {
		wg.Go(func() {
			before := sl.l.Stats().Dropped.ConnectionClosed
			ctx, cancel := context.WithTimeout(context.Background(), drain)
			defer cancel()
			err := sl.l.Shutdown(ctx)
			if lost := sl.l.Stats().Dropped.ConnectionClosed - before; lost > 0 || err != nil {
				ls.log.Warn("copies still queued for weida subscribers when the drain bound ran out were dropped",
					"listen", addr, "copies", lost, "reason", ReasonConnectionClosed)
			}
		})
	}
	wg.Wait()
}

// sameListenIdentity reports whether two resources may share a listener:
// the settings weida makes per listener must agree. The resource loader
// checks this across one load; this check covers a reload that changes one
// resource on a shared address while another keeps running.
// TrackReceipts is left out: a resource that acknowledges once queued and
// one that waits for receipts may share an address, and a listener kept
// across a reload that turns receipts on gets them from the new
// Publisher's TrackReceipts, which closes the connections accepted
// untracked.
func sameListenIdentity(a, b weida.ListenConfig) bool {
	return a.CertFile == b.CertFile && a.KeyFile == b.KeyFile && a.StateDir == b.StateDir &&
		slices.Equal(a.ClientFingerprints, b.ClientFingerprints) &&
		slices.Equal(a.ClientIdentities, b.ClientIdentities) && a.ClientCAFile == b.ClientCAFile &&
		a.Limits == b.Limits
}
