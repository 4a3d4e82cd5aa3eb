package weida

import (
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Why admit refused a connection: the CONNECTION_CLOSE reason of its
// LIMIT_EXCEEDED (or SHUTDOWN), which the subscriber reads in
// [CloseError].Reason, and the key of its count in [ConnectionRefusals].
const (
	RefusedMaxConnections        = "max_connections"
	RefusedMaxConnectionsPerPeer = "max_connections_per_peer"
	RefusedMaxConnectionsPerAddr = "max_connections_per_address"
	refusedClosing               = "listener closing"
)

// addressKey is what MaxConnectionsPerAddress counts connections by: an
// IPv4 address (an IPv4-mapped IPv6 one as IPv4), or the /64 an IPv6
// address belongs to. A host given an IPv6 /64 can use any of its 2^64
// addresses, so counting them one by one would bound nothing; a /64 is
// also what one LAN gets, so its hosts share a count as they would behind
// an IPv4 NAT. The zone is dropped: it names our interface, not the peer.
func addressKey(a net.Addr) netip.Addr {
	ua, ok := a.(*net.UDPAddr)
	if !ok {
		return netip.Addr{}
	}
	ip := ua.AddrPort().Addr().Unmap().WithZone("")
	if ip.Is4() {
		return ip
	}
	p, err := ip.Prefix(64)
	if err != nil {
		return ip
	}
	return p.Addr()
}

// rateLog logs one line per key at most every interval, saying how many
// were suppressed since: a flood of refusals (1,100 connections from one
// host, a SUBSCRIBE loop) must not become a flood of log lines. Safe for
// concurrent use; the zero value is not usable, see newRateLog.
type rateLog struct {
	log      *slog.Logger
	interval time.Duration

	mu   sync.Mutex
	keys map[string]*rateLogKey // bounded by the callers' key sets
}

type rateLogKey struct {
	last       time.Time
	suppressed int
}

// rateLogInterval is how often a rate-limited line repeats.
const rateLogInterval = 10 * time.Second

func newRateLog(log *slog.Logger) *rateLog {
	return &rateLog{log: log, interval: rateLogInterval, keys: make(map[string]*rateLogKey)}
}

// warn logs msg with args at Warn unless a line for key was logged within
// the interval, in which case it only counts it.
func (r *rateLog) warn(key, msg string, args ...any) {
	now := time.Now()
	r.mu.Lock()
	k := r.keys[key]
	if k == nil {
		k = &rateLogKey{}
		r.keys[key] = k
	}
	if !k.last.IsZero() && now.Sub(k.last) < r.interval {
		k.suppressed++
		r.mu.Unlock()
		return
	}
	n := k.suppressed
	k.last, k.suppressed = now, 0
	r.mu.Unlock()
	if n > 0 {
		args = append(args, "suppressed_since_last", n)
	}
	r.log.Warn(msg, args...)
}
