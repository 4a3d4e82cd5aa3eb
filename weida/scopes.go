package weida

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"weida.dev/connector/weida/address"
	"weida.dev/connector/weida/topic"
)

// Scopes says, for one publisher path, what each client may subscribe to:
// the filters ("scopes") listed for its proved fingerprint ("sha256:<hex>")
// or for a CA-issued identity it was admitted under ("dns:…", "uri:…",
// "email:…", "cn:…"; see ListenConfig.ClientIdentities). A client known
// under several keys gets the union of their scopes. A SUBSCRIBE is
// admitted only when its filter is covered by them, that is when every
// topic the filter can match is matched by at least one of the client's
// scopes ([topic.CoveredBy]); a client not listed, or anonymous, may
// subscribe to nothing on the path. []string{"#"} allows everything.
type Scopes map[string][]string

// ScopeStats counts what the Scopes of one path refused.
type ScopeStats struct {
	NotCovered uint64 // SUBSCRIBEs refused: the filter is not covered by the client's scopes
	Unlisted   uint64 // SUBSCRIBEs refused: the client has no scopes on the path (not listed, or anonymous)
	Revoked    uint64 // subscriptions dropped because SetScopes no longer covered them
	// Clients counts NotCovered and Revoked per client listed in the
	// path's Scopes when it happened (its fingerprint, or else the first
	// identity listed that it carries), so it holds no more clients than
	// the configuration ever named.
	Clients map[string]uint64
}

// Scope refusal reasons, as logged and as the connector labels its metric.
const (
	ScopeNotCovered = "not-covered" // the filter reaches topics outside the client's scopes
	ScopeUnlisted   = "unlisted"    // the client has no scopes on the path
	ScopeRevoked    = "revoked"     // a held subscription the new scopes no longer cover
)

// SetScopes restricts the subscriptions on path to s (see [Scopes]), or
// lifts the restriction when s is nil; the listener keeps its own copy. It
// validates first: a path, fingerprint or filter that is not valid fails
// with every fault joined, and nothing changes.
//
// The new scopes apply to every SUBSCRIBE from then on, and to the
// subscriptions connections already hold on path: those no longer covered
// are dropped, counted in [ScopeStats].Revoked and logged, while the
// connection stays up with the rest. Copies of a dropped subscription
// already queued for the connection are still written; none is queued
// after SetScopes returns.
//
// A SUBSCRIBE that is not admitted is refused with STOP_SENDING(REJECTED)
// on its stream, the refusal PROTOCOL §9.4 gives an acceptor that declines
// a peer on its proved identity; the connection and its other
// subscriptions stay. The refusal is counted (ListenerStats.Scopes) and
// logged at Warn with the client's fingerprint, at most once per
// ScopeLogInterval per path, client and reason, with the number of
// refusals not logged in between.
//
// Scopes are independent of ListenConfig.ClientFingerprints and
// ClientIdentities, which decide who may connect at all. SetScopes is safe for concurrent use; it fails
// with ErrClosed after Close.
func (l *Listener) SetScopes(path string, s Scopes) error {
	var errs []error
	if err := address.ValidatePath(path); err != nil {
		errs = append(errs, err)
	}
	for _, fp := range slices.Sorted(maps.Keys(s)) {
		if address.ValidateFingerprint(fp) != nil && address.ValidateIdentity(fp) != nil {
			errs = append(errs, fmt.Errorf("client %q: neither a fingerprint nor an identity: %w", fp,
				errors.Join(address.ValidateFingerprint(fp), address.ValidateIdentity(fp))))
		}
		for _, f := range s[fp] {
			if err := topic.ValidateFilter(f); err != nil {
				errs = append(errs, fmt.Errorf("client %s: scope %q: %w", fp, f, err))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("weida: scopes of %q: %w", path, err)
	}
	var cp Scopes
	if s != nil {
		cp = make(Scopes, len(s))
		for fp, fs := range s {
			cp[fp] = slices.Clone(fs)
		}
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return fmt.Errorf("weida: scopes of %q: %w", path, ErrClosed)
	}
	if cp == nil {
		delete(l.scopes, path)
	} else {
		l.scopes[path] = cp
		if l.scopeStats[path] == nil {
			// Present at zero from now on, for the metrics built on it.
			l.scopeStats[path] = &ScopeStats{Clients: make(map[string]uint64)}
		}
	}
	conns := make([]*serverConn, 0, len(l.conns))
	for sc := range l.conns {
		conns = append(conns, sc)
	}
	l.mu.Unlock()
	// A SUBSCRIBE checks the scopes and records its filter under the
	// connection's subMu, and revoke takes it after the swap above: a
	// filter admitted by the old scopes is either recorded by now, and
	// revoked here, or checked against the new ones.
	for _, sc := range conns {
		sc.revoke(path)
	}
	return nil
}

// admitsLocked decides a SUBSCRIBE of filter on path from sc: "" when
// admitted, or the refusal reason. l.mu must be held.
func (l *Listener) admitsLocked(path string, sc *serverConn, filter string) string {
	s, ok := l.scopes[path]
	if !ok {
		return ""
	}
	scopes, listed := s[sc.peer]
	// The union of every key the client is known under: one certificate
	// may carry several listed identities, each granting part. Copied
	// only when a second key adds to the first, so that a client known
	// by its fingerprint alone costs nothing.
	copied := false
	for _, n := range sc.names {
		fs, ok := s[n]
		if n == sc.peer || !ok {
			continue
		}
		if !copied && listed {
			scopes, copied = slices.Clone(scopes), true
		}
		scopes, listed = append(scopes, fs...), true
	}
	switch {
	case !listed:
		return ScopeUnlisted
	case topic.CoveredBy(filter, scopes):
		return ""
	default:
		return ScopeNotCovered
	}
}

// scopeClientLocked returns the key the Clients counter of path counts
// sc under: its fingerprint when the scopes list it, else the first
// identity they list, else "" (unlisted, not counted). l.mu must be held.
func (l *Listener) scopeClientLocked(path string, sc *serverConn) string {
	s := l.scopes[path]
	if _, ok := s[sc.peer]; ok {
		return sc.peer
	}
	for _, n := range sc.names {
		if _, ok := s[n]; ok {
			return n
		}
	}
	return ""
}

// countScopeLocked counts one refusal or revocation on path. l.mu must
// be held.
func (l *Listener) countScopeLocked(path string, sc *serverConn, reason string) {
	st := l.scopeStats[path]
	if st == nil {
		st = &ScopeStats{Clients: make(map[string]uint64)}
		l.scopeStats[path] = st
	}
	switch reason {
	case ScopeNotCovered:
		st.NotCovered++
	case ScopeUnlisted:
		st.Unlisted++
	case ScopeRevoked:
		st.Revoked++
	}
	if who := l.scopeClientLocked(path, sc); who != "" && reason != ScopeUnlisted {
		st.Clients[who]++
	}
}

// scopeStatsLocked returns a copy of the scope counters. l.mu must be
// held.
func (l *Listener) scopeStatsLocked() map[string]ScopeStats {
	if len(l.scopeStats) == 0 {
		return nil
	}
	out := make(map[string]ScopeStats, len(l.scopeStats))
	for path, st := range l.scopeStats {
		c := *st
		c.Clients = maps.Clone(st.Clients)
		out[path] = c
	}
	return out
}

// revoke drops sc's subscriptions on path that the path's scopes no
// longer admit.
func (sc *serverConn) revoke(path string) {
	l := sc.l
	var gone []string
	sc.subMu.Lock()
	l.mu.Lock()
	for k := range sc.subs {
		if k.path == path && l.admitsLocked(path, sc, k.filter) != "" {
			gone = append(gone, k.filter)
			l.countScopeLocked(path, sc, ScopeRevoked)
		}
	}
	l.mu.Unlock()
	for _, f := range gone {
		sc.unsubscribeLocked(path, f)
	}
	sc.subMu.Unlock()
	for _, f := range gone {
		l.scopeLog.log(sc, path, f, ScopeRevoked)
	}
}

// ScopeLogInterval is the least time between two log lines about scope
// refusals of one client on one path for one reason; the refusals in
// between are counted and reported on the next line.
const ScopeLogInterval = 10 * time.Second

// maxScopeLogKeys bounds the memory of scopeLog: past it, clients share
// one key, so that anonymous or unlisted peers cannot grow it.
const maxScopeLogKeys = 1024

// scopeLog rate-limits the log lines of scope refusals per path, client
// and reason. Safe for concurrent use.
type scopeLog struct {
	mu   sync.Mutex
	keys map[scopeLogKey]*scopeLogState
}

type scopeLogKey struct{ path, peer, reason string }

type scopeLogState struct {
	last       time.Time
	suppressed int
}

func (r *scopeLog) log(sc *serverConn, path, filter, reason string) {
	k := scopeLogKey{path, sc.peer, reason}
	now := time.Now()
	r.mu.Lock()
	if r.keys == nil {
		r.keys = make(map[scopeLogKey]*scopeLogState)
	}
	st := r.keys[k]
	if st == nil && len(r.keys) >= maxScopeLogKeys {
		k.peer = "(others)"
		st = r.keys[k]
	}
	if st == nil {
		st = &scopeLogState{}
		r.keys[k] = st
	} else if now.Sub(st.last) < ScopeLogInterval {
		st.suppressed++
		r.mu.Unlock()
		return
	}
	st.last = now
	suppressed := st.suppressed
	st.suppressed = 0
	r.mu.Unlock()
	msg := "weida: refused SUBSCRIBE outside the client's scopes (STOP_SENDING REJECTED)"
	if reason == ScopeRevoked {
		msg = "weida: dropped a subscription the new scopes no longer cover"
	}
	peer := sc.peer
	if peer == "" {
		peer = "(anonymous)"
	}
	args := []any{"path", path, "filter", filter, "client", peer, "reason", reason,
		"remote", sc.c.qc.RemoteAddr().String()}
	if len(sc.names) > 0 {
		args = append(args, "names", sc.names)
	}
	if suppressed > 0 {
		args = append(args, "suppressed_since_last", suppressed)
	}
	sc.l.log.Warn(msg, args...)
}
