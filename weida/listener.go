package weida

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
	"golang.org/x/time/rate"

	"weida.dev/connector/weida/address"
	"weida.dev/connector/weida/topic"
	"weida.dev/connector/weida/wire"
)

// Listener is a weida QUIC server hosting any number of publisher paths
// ([Listener.Publisher]). Subscribers dial it, exchange HELLO and SUBSCRIBE
// to a path's topics; every publish goes to them as one DATA copy per
// subscriber connection.
//
// A Listener serves from [Listen] until [Listener.Close] or
// [Listener.Shutdown]; its methods are safe for concurrent use. Every
// goroutine it starts has ended when Close returns.
type Listener struct {
	limits Limits
	log    *slog.Logger
	fp     string
	certs  *certReloader // with CertFile and KeyFile: serves them, reloaded on change

	udp    *net.UDPConn
	tr     *quic.Transport
	ln     *quic.Listener
	proofs *proofs // handshakes admitted by the client allowlist, until accepted

	cancel context.CancelFunc // stops the accept loop
	wg     sync.WaitGroup     // the accept loop and every connection's supervisor

	// mu guards the fields below, pathState.pub and pathState.refs. Lock
	// order: serverConn.subMu, then mu, then the index's own lock.
	mu      sync.Mutex
	closed  bool
	paths   map[string]*pathState
	conns   map[*serverConn]struct{}
	perPeer map[string]int
	// perAddr counts the connections MaxConnectionsPerAddress bounds, by
	// addressKey.
	perAddr map[netip.Addr]int
	// allowlist is set when ClientFingerprints admit clients: only then
	// does a fingerprint prove a peer that MaxConnectionsPerPeer alone
	// bounds.
	allowlist bool
	// auth admits clients and names them for Scopes.
	auth *clientAuth
	// warn rate-limits the lines of refusals a peer can cause at will.
	warn *rateLog
	// scopes are the SetScopes of each restricted path; scopeStats count
	// their refusals, per path, for as long as the listener lives.
	scopes     map[string]Scopes
	scopeStats map[string]*ScopeStats
	scopeLog   scopeLog

	frames framePool
	turns  sendTurns // see sendTurns
	// receipts is set at Listen (ListenConfig.TrackReceipts) or, under
	// mu, once a Publisher tracks receipts: connections accepted from
	// then on get a receiptTracker, and those accepted before are closed.
	receipts atomic.Bool
	stats    listenerCounters
	hooks    connHooks
}

// pathState is one path that holds a publisher, subscriptions, or both.
type pathState struct {
	path string
	idx  *topic.Index[*connPath] // (filter, subscriber connection) entries; internally locked
	pub  *Publisher              // nil while no publisher holds the path; Listener.mu
	refs int                     // connections with >= 1 filter here; Listener.mu
	// changed is closed and forgotten when a subscription is added here;
	// nil until a Publisher asks for it. Listener.mu.
	changed chan struct{}

	// fan orders fan-out against replay: Publish holds it for reading
	// from its record hook to its last queued copy, and a SUBSCRIBE holds
	// it for writing from inserting its filter to queueing its last
	// replayed copy. Lock order: serverConn.subMu, then fan, then the
	// index's lock, the Replayer's own locks and the send queues'.
	fan       sync.RWMutex
	replay    Replayer   // fan; nil: nothing is replayed
	replayPub *Publisher // fan; the publisher that set replay, which stops replaying once closed
	// advertised is replayPub while replay is set, nil otherwise: read
	// without fan by the HELLO of each new connection (see helloExtensions).
	advertised atomic.Pointer[Publisher]
}

// subscribedLocked wakes whoever waits for a subscription on ps. l.mu
// must be held.
func (ps *pathState) subscribedLocked() {
	if ps.changed != nil {
		close(ps.changed)
		ps.changed = nil
	}
}

// Listen starts a weida listener on addr ("host:port"; port 0 picks a free
// one) and serves until Close or Shutdown. ctx bounds only the start-up.
//
// With cfg.CertFile and cfg.KeyFile empty it uses a self-signed ECDSA P-256
// certificate, kept in cfg.StateDir (see [StateFiles]) or generated now, and
// logs its fingerprint at Info level; subscribers pin it in their URL
// (weida://<fingerprint>@host:port/path).
func Listen(ctx context.Context, addr string, cfg ListenConfig) (*Listener, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	limits, err := cfg.Limits.withDefaults(true)
	if err != nil {
		return nil, err
	}
	log := loggerOrDiscard(cfg.Logger)
	l := &Listener{
		limits:  limits,
		log:     log,
		paths:   make(map[string]*pathState),
		conns:   make(map[*serverConn]struct{}),
		perPeer: make(map[string]int),
		perAddr: make(map[netip.Addr]int),
		turns:   newSendTurns(),
		warn:    newRateLog(log),

		allowlist:  len(cfg.ClientFingerprints) > 0 || len(cfg.ClientIdentities) > 0,
		scopes:     make(map[string]Scopes),
		scopeStats: make(map[string]*ScopeStats),
	}
	l.receipts.Store(cfg.TrackReceipts)
	l.proofs = newProofs(log, &l.stats.clientsRefused)
	auth, err := newClientAuth(&cfg, log)
	if err != nil {
		return nil, err
	}
	l.auth = auth
	tlsConf, fp, generated, reload, err := serverTLS(addr, &cfg, auth, log, &l.stats.clientsRefused, l.proofs)
	if err != nil {
		return nil, err
	}
	var resetKey *quic.StatelessResetKey
	switch {
	case cfg.ResetKeyFile != "":
		resetKey, err = fileResetKey(cfg.ResetKeyFile)
	case cfg.StateDir != "":
		resetKey, err = stateResetKey(cfg.StateDir)
	default:
		resetKey, err = processResetKey()
	}
	if err != nil {
		return nil, err
	}
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("weida: listen %s: %w", addr, err)
	}
	udp, err := net.ListenUDP("udp", ua)
	if err != nil {
		return nil, fmt.Errorf("weida: listen %s: %w", addr, err)
	}
	// The reset key makes the transport answer packets of connections it
	// does not know (those of a previous process on this address, when the
	// key is kept in StateDir, or of another replica that held the endpoint,
	// when every replica reads one ResetKeyFile) with a stateless reset, so
	// that their subscribers do not wait for their idle timeout.
	tr := &quic.Transport{Conn: udp, StatelessResetKey: resetKey, ConnContext: l.connContext}
	qconf := limits.quicConfig()
	// Returns nil, and so costs quic-go nothing, for connections without
	// a tracker (see Publisher.TrackReceipts).
	qconf.Tracer = tracer
	if cfg.QUICTracer != nil {
		qconf.Tracer = bothTracers(tracer, cfg.QUICTracer)
	}
	ln, err := tr.Listen(tlsConf, qconf)
	if err != nil {
		_ = tr.Close()
		_ = udp.Close()
		return nil, fmt.Errorf("weida: listen %s: %w", addr, err)
	}
	l.fp, l.certs, l.udp, l.tr, l.ln = fp, reload, udp, tr, ln
	l.hooks = connHooks{
		parked:     &l.stats.streamsParked,
		violations: &l.stats.protocolViolations,
		negFailed:  &l.stats.negotiationFailures,
		refused:    &l.stats.streamsRefused,
	}
	log.Info("weida: listening", "addr", udp.LocalAddr().String(), "fingerprint", fp,
		"self_signed", generated, "state_dir", cfg.StateDir, "client_auth", auth.enabled(), "client_ca_file", cfg.ClientCAFile)
	actx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	l.wg.Go(func() { l.accept(actx) })
	return l, nil
}

// Addr returns the UDP address the listener is bound to.
func (l *Listener) Addr() net.Addr { return l.udp.LocalAddr() }

// Fingerprint returns "sha256:<hex>" of the listener certificate's public
// key, which subscribers pin.
// With CertFile and KeyFile it is the fingerprint of the certificate the
// files hold now: they are loaded again when they change (see
// [CertCheckInterval]).
func (l *Listener) Fingerprint() string {
	if l.certs != nil {
		_, fp := l.certs.current()
		return fp
	}
	return l.fp
}

// Publisher registers a publisher at path (which must start with '/', be at
// most 512 bytes and hold no byte below 0x20). Subscriptions that arrived for
// the path before it was registered start receiving at once. It fails with
// [ErrPathTaken] while another Publisher holds the path, and with
// [ErrClosed] after Close.
func (l *Listener) Publisher(path string) (*Publisher, error) {
	if err := address.ValidatePath(path); err != nil {
		return nil, fmt.Errorf("weida: publisher %q: %w", path, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, fmt.Errorf("weida: publisher %q: %w", path, ErrClosed)
	}
	ps := l.pathLocked(path)
	if ps.pub != nil {
		return nil, fmt.Errorf("weida: publisher %q: %w", path, ErrPathTaken)
	}
	p := &Publisher{l: l, path: path, ps: ps}
	ps.pub = p
	return p, nil
}

// pathLocked returns the state of path, creating it. l.mu must be held.
func (l *Listener) pathLocked(path string) *pathState {
	ps := l.paths[path]
	if ps == nil {
		ps = &pathState{path: path, idx: topic.NewIndex[*connPath]()}
		l.paths[path] = ps
	}
	return ps
}

// dropPathLocked forgets ps once nothing refers to it. l.mu must be held.
func (l *Listener) dropPathLocked(ps *pathState) {
	if ps.pub == nil && ps.refs == 0 && l.paths[ps.path] == ps {
		delete(l.paths, ps.path)
	}
}

func (l *Listener) unregister(p *Publisher) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p.ps.pub == p {
		p.ps.pub = nil
		l.dropPathLocked(p.ps)
	}
}

// publisherAt reports whether a publisher is registered at path.
func (l *Listener) publisherAt(path string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	ps := l.paths[path]
	return ps != nil && ps.pub != nil
}

func (l *Listener) accept(ctx context.Context) {
	for {
		qc, err := l.ln.Accept(ctx)
		if err != nil {
			return
		}
		l.admit(qc)
	}
}

// admit applies the connection limits to a handshaken connection and starts
// serving it.
func (l *Listener) admit(qc *quic.Conn) {
	l.proofs.completed(qc.RemoteAddr().String())
	state := qc.ConnectionState().TLS
	if state.NegotiatedProtocol != ALPN { // quic-go and crypto/tls enforce it; stay explicit
		_ = qc.CloseWithError(quic.ApplicationErrorCode(ProtocolViolation), "ALPN must be "+ALPN)
		return
	}
	peer := ""
	var names []string
	if len(state.PeerCertificates) > 0 {
		peer = Fingerprint(state.PeerCertificates[0])
		// The names the handshake admitted it under, again: the CA file
		// may have changed in between, and then the new one decides
		// what the connection may subscribe to.
		names, _ = l.auth.identify(state.PeerCertificates, time.Now())
	}
	// Connections a fingerprint does not prove (see Limits.
	// MaxConnectionsPerAddress) are counted by their source address.
	byAddr := peer == "" || !l.allowlist
	addr := addressKey(qc.RemoteAddr())
	l.mu.Lock()
	var refuse string
	code := LimitExceeded
	switch {
	case l.closed:
		refuse, code = refusedClosing, Shutdown
	case l.receipts.Load() && trackerOf(qc) == nil:
		// Its handshake began before a Publisher tracked receipts, and
		// trackReceipts closed the others of its kind: see
		// Publisher.TrackReceipts.
		refuse, code = untrackedReason, Shutdown
	case len(l.conns) >= l.limits.MaxConnections:
		refuse = RefusedMaxConnections
	case peer != "" && l.perPeer[peer] >= l.limits.MaxConnectionsPerPeer:
		refuse = RefusedMaxConnectionsPerPeer
	case byAddr && l.perAddr[addr] >= l.limits.MaxConnectionsPerAddress:
		refuse = RefusedMaxConnectionsPerAddr
	}
	if refuse != "" {
		l.mu.Unlock()
		l.stats.refused(refuse)
		l.warn.warn("refused:"+refuse, "weida: refusing connection", "remote", qc.RemoteAddr().String(), "fingerprint", peer, "reason", refuse)
		// CloseWithError waits for the connection's loop to end; the
		// accept loop must not. quic-go holds at most 32 handshaken
		// connections for Accept and refuses the next with a bare
		// CONNECTION_REFUSED, so a flood refused one at a time here
		// would crowd out the subscribers behind it (issue 25).
		l.wg.Go(func() { _ = qc.CloseWithError(quic.ApplicationErrorCode(code), refuse) })
		return
	}
	sc := &serverConn{l: l, peer: peer, names: names, subs: make(map[subKey]struct{}), paths: make(map[string]*connPath)}
	if byAddr {
		sc.addr, sc.byAddr = addr, true
		l.perAddr[addr]++
	}
	sc.replays = rate.NewLimiter(rate.Every(l.limits.ReplayInterval), l.limits.ReplayBurst)
	log := l.log
	if peer != "" {
		log = log.With("fingerprint", peer)
	}
	sc.c = newConn(qc, &l.limits, log, sc, &l.hooks)
	sc.receipts = trackerOf(qc)
	sc.c.local.Extensions = l.helloExtensionsLocked()
	sc.q.init(l.limits.SlowConsumerAfter)
	sc.wl.init(&l.limits)
	l.conns[sc] = struct{}{}
	if peer != "" {
		l.perPeer[peer]++
	}
	l.mu.Unlock()
	l.stats.connectionsAccepted.Add(1)
	sc.c.start()
	l.wg.Go(sc.serve)
}

// helloExtensionsLocked returns the extension keys of the HELLO a new
// connection gets: the last-value advertisement (wire.HelloLastValue)
// listing the paths whose publisher has a Replayer, when one has. The
// HELLO goes out before the subscriber names its path, so it speaks for
// every path of the listener. l.mu must be held.
func (l *Listener) helloExtensionsLocked() []wire.Extension {
	var paths []string
	for path, ps := range l.paths {
		if p := ps.advertised.Load(); p != nil && p == ps.pub && !p.closed.Load() {
			paths = append(paths, path)
		}
	}
	if len(paths) == 0 {
		return nil
	}
	slices.Sort(paths)
	ad := wire.AppendLastValueAd(nil, &wire.LastValueAd{Version: wire.LastValueVersion, Paths: paths})
	return []wire.Extension{{Key: wire.HelloLastValue, Value: ad}}
}

// Close stops accepting, closes every connection with SHUTDOWN, unregisters
// every publisher and waits until all of the listener's goroutines have
// ended. Copies still queued are dropped (see [Listener.Shutdown] to drain
// them first). Close returns nil, also when called again.
func (l *Listener) Close() error {
	l.proofs.close()
	l.mu.Lock()
	already := l.closed
	l.closed = true
	conns := make([]*serverConn, 0, len(l.conns))
	for sc := range l.conns {
		conns = append(conns, sc)
	}
	for _, ps := range l.paths {
		if ps.pub != nil {
			ps.pub.closed.Store(true)
		}
	}
	l.mu.Unlock()
	if already {
		l.wg.Wait()
		return nil
	}
	l.cancel()
	_ = l.ln.Close()
	var wg sync.WaitGroup
	for _, sc := range conns {
		wg.Go(func() { sc.c.close(Shutdown, "listener closed") })
	}
	wg.Wait()
	l.wg.Wait()
	_ = l.tr.Close()
	_ = l.udp.Close()
	return nil
}

// Shutdown stops accepting connections and publishes, waits until every
// connection's queued copies have been handed to QUIC or ctx is done, and
// then, after a few round trips for QUIC to send them (see flushGrace),
// closes like [Listener.Close]. It returns ctx's error when copies were
// still queued. Bytes QUIC has not yet delivered when the connections close
// may still be lost: weida v0 has no application acknowledgement to wait
// for.
func (l *Listener) Shutdown(ctx context.Context) error {
	l.mu.Lock()
	if !l.closed {
		for _, ps := range l.paths {
			if ps.pub != nil {
				ps.pub.closed.Store(true)
			}
		}
	}
	l.mu.Unlock()
	l.cancel()
	_ = l.ln.Close()
	var err error
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
wait:
	for !l.drained() {
		select {
		case <-ctx.Done():
			err = ctx.Err()
			break wait
		case <-tick.C:
		}
	}
	if err == nil {
		// The queues are with QUIC now, not yet on the wire: a
		// CONNECTION_CLOSE sent at once would discard the stream data
		// still unsent (the chaos suite lost such a copy when its weida
		// publisher closed). A few round trips let QUIC send it and hear
		// the acknowledgements.
		select {
		case <-time.After(l.flushGrace()):
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	_ = l.Close()
	return err
}

// flushGrace is how long Shutdown gives QUIC to deliver what the writers
// handed it: four smoothed round trips and their deviation on the slowest
// connection, at least 20 ms (timer and scheduling slack on a busy
// machine), at most a second.
func (l *Listener) flushGrace() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	grace := 20 * time.Millisecond
	for sc := range l.conns {
		st := sc.c.qc.ConnectionStats()
		grace = max(grace, 4*st.SmoothedRTT+st.MeanDeviation)
	}
	return min(grace, time.Second)
}

// drained reports whether no connection has a copy queued or in writing.
func (l *Listener) drained() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for sc := range l.conns {
		if !sc.q.idle() {
			return false
		}
	}
	return true
}

// subKey names one subscription of a connection.
type subKey struct{ path, filter string }

// connPath is a connection's presence on one path: the value the path's
// index holds for each of the connection's filters there, so that a topic
// matching several of them still yields the connection once.
type connPath struct {
	sc      *serverConn
	ps      *pathState
	filters int // sc.subMu
}

// serverConn is the listener side of one connection: its subscriptions and
// its fan-out writer.
type serverConn struct {
	l    *Listener
	c    *conn
	peer string // proved client fingerprint, "" when anonymous
	// names are those auth admitted the client under (its listed
	// fingerprint, its listed CA-issued identities), sorted: the keys of
	// Scopes that apply to it. Nil when the listener lists no clients.
	names []string
	// addr is the connection's count in Listener.perAddr, when byAddr.
	addr   netip.Addr
	byAddr bool
	// replays bounds the replays the connection's SUBSCRIBEs get
	// (Limits.ReplayBurst); used under the path's fan lock.
	replays *rate.Limiter

	subMu  sync.Mutex
	subs   map[subKey]struct{}
	paths  map[string]*connPath
	closed bool // subMu; no subscription is added once set

	q  sendQueue
	wl writtenLog // the writer's; read by serve once the writer ended
	// receipts learns which copies the peer acknowledged; nil unless the
	// connection was accepted while a Publisher tracked receipts.
	receipts *receiptTracker
}

// serve supervises the connection: it runs the writer, and once the
// connection is closed drops its subscriptions and queue, waits for its
// goroutines and forgets it.
func (sc *serverConn) serve() {
	var wg sync.WaitGroup
	wg.Go(sc.writer)
	select {
	case <-sc.c.ctx.Done():
	case <-sc.q.stalled:
		sc.closeSlowConsumer()
		<-sc.c.ctx.Done()
	}
	ended := time.Since(sc.wl.start)
	sc.dropSubscriptions()
	sc.q.close(&sc.l.stats)
	wg.Wait()
	if sc.receipts != nil {
		sc.receipts.end() // after the writer: it watches no stream any more
	}
	sc.c.wait()
	cause := context.Cause(sc.c.ctx)
	// Reported before the connection is forgotten, so that a caller who
	// sees it gone from Stats().Connections also sees its report.
	sc.wl.finish(&sc.l.stats, ended, cause, sc.c.qc.RemoteAddr().String(), sc.c.agreed.peerMaxTransfers,
		idleReach(sc.l.limits.IdleTimeout, sc.c.qc.ConnectionStats()))
	l := sc.l
	l.mu.Lock()
	delete(l.conns, sc)
	if sc.peer != "" {
		if l.perPeer[sc.peer]--; l.perPeer[sc.peer] <= 0 {
			delete(l.perPeer, sc.peer)
		}
	}
	if sc.byAddr {
		if l.perAddr[sc.addr]--; l.perAddr[sc.addr] <= 0 {
			delete(l.perAddr, sc.addr)
		}
	}
	l.mu.Unlock()
	sc.c.log.Debug("weida: connection ended", "cause", cause)
}

// closeSlowConsumer applies the slow-consumer policy (see
// Limits.SlowConsumerAfter): the subscriber is over its bound, or its
// connection tracks receipts, and it has taken no copy for that long, so
// it is closed with LIMIT_EXCEEDED, the code PROTOCOL §7 gives a local
// limit, logged and counted. Its queued copies are then counted as
// ConnectionClosed, like any closed connection's.
func (sc *serverConn) closeSlowConsumer() {
	st := &sc.l.stats
	st.slowConsumersClosed.Add(1)
	sc.q.mu.Lock()
	queued, charged, cause := len(sc.q.items)-sc.q.head, sc.q.bytes, sc.q.stallCause
	sc.q.mu.Unlock()
	sc.c.log.Warn("weida: closing slow consumer: "+cause,
		"remote", sc.c.qc.RemoteAddr().String(), "for", sc.l.limits.SlowConsumerAfter,
		"queued_copies", queued, "charged_bytes", charged,
		"subscriber_buffer_bytes", sc.l.limits.SubscriberBufferBytes)
	sc.c.close(LimitExceeded, "slow consumer: no copy taken for "+sc.l.limits.SlowConsumerAfter.String())
}

func (sc *serverConn) dropSubscriptions() {
	sc.subMu.Lock()
	defer sc.subMu.Unlock()
	sc.closed = true
	l := sc.l
	for k := range sc.subs {
		if cp := sc.paths[k.path]; cp != nil {
			cp.ps.idx.Remove(k.filter, cp)
		}
	}
	l.stats.subscriptions.Add(-int64(len(sc.subs)))
	clear(sc.subs)
	l.mu.Lock()
	for _, cp := range sc.paths {
		cp.ps.refs--
		l.dropPathLocked(cp.ps)
	}
	l.mu.Unlock()
	clear(sc.paths)
}

// data refuses a uni DATA stream: nothing on a listener accepts one
// (PROTOCOL §9.4).
func (sc *serverConn) data(c *conn, st *quic.ReceiveStream, _ int, d wire.Data) {
	if sc.l.publisherAt(d.Endpoint) {
		c.refuse(st, Unsupported)
		return
	}
	c.refuse(st, UnknownEndpoint)
}

func (sc *serverConn) serves(path string) bool { return sc.l.publisherAt(path) }

// subscription applies SUBSCRIBE and UNSUBSCRIBE (PROTOCOL §6.4). It
// returns Rejected for a SUBSCRIBE the path's Scopes do not admit: the
// caller stops the stream with it (PROTOCOL §9.4, see SetScopes).
func (sc *serverConn) subscription(c *conn, s *wire.Subscribe, add bool) Code {
	if err := topic.ValidateFilter(s.Filter); err != nil {
		c.violation("SUBSCRIBE filter: %v", err)
		return NoError
	}
	if !add {
		sc.unsubscribe(s.Endpoint, s.Filter)
		return NoError
	}
	switch refused, ok := sc.subscribe(s.Endpoint, s.Filter); {
	case !ok:
		c.log.Warn("weida: closing connection: max_subscriptions exceeded", "max_subscriptions", sc.l.limits.MaxSubscriptions)
		c.close(LimitExceeded, "max_subscriptions")
	case refused != "":
		sc.l.scopeLog.log(sc, s.Endpoint, s.Filter, refused)
		return Rejected
	}
	return NoError
}

// subscribe records (path, filter); ok is false when that would exceed
// max_subscriptions, and refused names why the path's scopes do not admit
// it. A held subscription, or a closed connection, is a no-op.
func (sc *serverConn) subscribe(path, filter string) (refused string, ok bool) {
	sc.subMu.Lock()
	defer sc.subMu.Unlock()
	k := subKey{path, filter}
	if _, ok := sc.subs[k]; ok || sc.closed {
		return "", true
	}
	// Checked under subMu, which SetScopes's revocation takes after the
	// swap, so a filter admitted by old scopes cannot outlive new ones.
	l := sc.l
	l.mu.Lock()
	if refused = l.admitsLocked(path, sc, filter); refused != "" {
		l.countScopeLocked(path, sc, refused)
	}
	l.mu.Unlock()
	if refused != "" {
		return refused, true
	}
	if len(sc.subs) >= l.limits.MaxSubscriptions {
		return "", false
	}
	cp := sc.paths[path]
	if cp == nil {
		l.mu.Lock()
		ps := l.pathLocked(path)
		ps.refs++
		l.mu.Unlock()
		cp = &connPath{sc: sc, ps: ps}
		sc.paths[path] = cp
	}
	cp.ps.fan.Lock()
	err := cp.ps.idx.Insert(filter, cp)
	if err == nil {
		// Counted before any copy can match it: once a copy for it has
		// been queued or received, every later Stats counts it.
		l.stats.subscriptions.Add(1)
		// Only an admitted filter is replayed, and a Replayer's copies are
		// matched against it (see replay): scopes that cover the filter
		// cover every topic replayed to it.
		sc.replay(cp.ps, filter)
	}
	cp.ps.fan.Unlock()
	if err != nil {
		return "", true // unreachable: the filter was validated
	}
	cp.filters++
	sc.subs[k] = struct{}{}
	l.mu.Lock()
	cp.ps.subscribedLocked()
	l.mu.Unlock()
	return "", true
}

func (sc *serverConn) unsubscribe(path, filter string) {
	sc.subMu.Lock()
	defer sc.subMu.Unlock()
	sc.unsubscribeLocked(path, filter)
}

// unsubscribeLocked drops (path, filter) if held. sc.subMu must be held.
func (sc *serverConn) unsubscribeLocked(path, filter string) {
	k := subKey{path, filter}
	if _, ok := sc.subs[k]; !ok {
		return // unknown: ignored (PROTOCOL §6.4)
	}
	delete(sc.subs, k)
	cp := sc.paths[path]
	cp.ps.idx.Remove(filter, cp)
	// Uncounted only once no further copy can match it (see subscribe).
	sc.l.stats.subscriptions.Add(-1)
	if cp.filters--; cp.filters == 0 {
		delete(sc.paths, path)
		l := sc.l
		l.mu.Lock()
		cp.ps.refs--
		l.dropPathLocked(cp.ps)
		l.mu.Unlock()
	}
}

// enqueue offers one copy to the connection's writer; anything but pushOK
// means dropped (and counted): pushClosed when nobody is left to take it,
// pushFull when the subscriber cannot (its buffer, its header limit),
// pushOwnReplay when its buffer is taken by a replay it asked for.
func (sc *serverConn) enqueue(f *frame) pushResult {
	st := &sc.l.stats
	if !sc.c.negotiated() { // unreachable: a subscription exists only after HELLO
		st.dropped.connectionClosed.Add(1)
		return pushClosed
	}
	if uint64(f.hdrLen) > sc.c.agreed.sendMaxHeaderBytes {
		st.dropped.headerTooLarge.Add(1)
		return pushFull
	}
	r := sc.q.push(f, sc.l.limits.SubscriberBufferBytes)
	switch r {
	case pushFull:
		st.dropped.bufferFull.Add(1)
	case pushOwnReplay:
		st.dropped.ownReplay.Add(1)
	case pushClosed:
		st.dropped.connectionClosed.Add(1)
	}
	return r
}

// sendNow is the write limiter of a copy the writer waits for: it limits
// nothing, but a write with a limiter returns only once QUIC has put the
// bytes into packets, where a plain Write of a small copy returns at once
// with the bytes parked in the stream.
func sendNow(maxBytes int) int { return maxBytes }

// writer opens one uni stream per queued copy and writes it, in queue
// order. Opening can wait for stream credit from a slow subscriber, and
// writing for its flow-control credit; those waits are here, never in
// Publish.
//
// At most maxParked copies are parked in QUIC at a time: the copy that
// reaches that number, or that empties the queue, is written with a
// limiter (sendNow) and the writer waits until QUIC has packetized it.
// QUIC sends a connection's streams of one priority round robin, in the
// order they got data, so by then the copies parked before it are in
// packets too and their charge is released. A subscriber's backlog
// therefore waits in its send queue, charged against its budget and
// dropped there when it does not fit, rather than in quic-go's stream
// state, which no budget saw (issue 21: 2.2 GB of it with 1,000
// subscribers) and which died uncounted with the peer.
//
// A writer hands copies to QUIC only while it holds one of the listener's
// send turns (see Listener.turns), at most writeBatch copies per turn. It
// gives its turn up before waiting for stream credit, and keeps it while
// QUIC packetizes the copies of its turn, for at most turnHold.
func (sc *serverConn) writer() {
	w := &copyWriter{sc: sc, done: time.Now()}
	w.hold = time.AfterFunc(turnHold, w.holdExpired)
	w.hold.Stop()
	defer func() {
		w.hold.Stop()
		w.give()
		sc.wl.parkedAtEnd = uint64(w.parked)
		sc.q.sent(w.parked)
	}()
	for {
		f := sc.q.pop(sc.c.ctx, w.done)
		if f == nil {
			return
		}
		for n := 1; ; n++ {
			if !w.write(f) {
				return
			}
			if n == writeBatch {
				break
			}
			var closed bool
			if f, closed = sc.q.tryPop(w.done); f == nil || closed {
				break
			}
		}
		w.give()
	}
}

// writeBatch is how many copies a writer hands to QUIC per send turn
// before it lets the next subscriber's writer have one: as many as it may
// park, so that a turn under load ends with the wait for them to be
// packetized (a turn starts with none parked: the one before ended with
// that wait, or with the wait of the copy that emptied the queue).
const writeBatch = maxParked

// turnHold bounds how long a writer keeps its send turn while it waits
// for QUIC to packetize its copies. That wait takes a hand-off to the
// connection's loop and back, far less than this, unless the subscriber's
// flow-control credit or the connection's congestion window holds the
// copies back; then the turn goes to the next writer and this one waits
// without it, as it would for stream credit.
const turnHold = 20 * time.Millisecond

// copyWriter is a connection's writer's state: whether it holds a send
// turn, the copies it has parked in QUIC since it last waited for them
// to be packetized, and when its last write ended.
type copyWriter struct {
	sc *serverConn
	// turn is whether the writer holds a send turn (turnNone, turnHeld,
	// turnHeldWaiting). One word, so that hold's function, which may run
	// late, can take the turn only from the wait it finds: whoever moves
	// turn to turnNone gives the turn back.
	turn   atomic.Int32
	hold   *time.Timer // gives the turn back after turnHold of waiting
	parked int
	// done is read once per copy, after the write, and serves both the
	// written log and the time the next copy is taken, when that follows
	// without a wait (see sendQueue.poppedAt): a clock read costs about as
	// much here as the rest of the writer's own bookkeeping.
	done time.Time
}

const (
	turnNone int32 = iota
	turnHeld
	turnHeldWaiting // held through writeAndWait's wait
)

// take is called by the writer only outside writeAndWait, where turn is
// never turnHeldWaiting.
func (w *copyWriter) take() bool {
	if w.turn.Load() == turnHeld {
		return true
	}
	if !w.sc.l.turns.take(w.sc.c.ctx) {
		return false
	}
	w.turn.Store(turnHeld)
	return true
}

func (w *copyWriter) give() {
	if w.turn.CompareAndSwap(turnHeld, turnNone) {
		w.sc.l.turns.give()
	}
}

// holdExpired is hold's function. Run late, after the wait that armed it,
// it finds no wait, or a later one whose hold it only shortens.
func (w *copyWriter) holdExpired() {
	if w.turn.CompareAndSwap(turnHeldWaiting, turnNone) {
		w.sc.l.turns.give()
	}
}

// writeAndWait writes b with the limiter that makes the write return only
// once QUIC has put it into packets, keeping the writer's turn for up to
// turnHold of that wait.
//
// Keeping it is what bounds how many connections have copies waiting for
// QUIC to packetize them: at most the turns. When writers gave their turn
// up before this wait, the next writers handed over their copies at once,
// and under saturation each of 1,000 connections had some waiting, so its
// loop and its send queue's goroutine were runnable; the one goroutine
// that reads the listener's socket waited behind 2,000 of them on the
// run queues, for up to 1.9 s in a 20 s run, and the acknowledgements it
// had not read cost reading subscribers their connections to the 2 s
// idle timeout (docs/PERFORMANCE.md).
func (w *copyWriter) writeAndWait(s *quic.SendStream, b []byte) error {
	armed := w.turn.CompareAndSwap(turnHeld, turnHeldWaiting)
	if armed {
		w.hold.Reset(turnHold)
	}
	_, err := s.WriteWithLimit(b, sendNow)
	if armed {
		w.hold.Stop()
		// Fails when hold took the turn: the next write takes another.
		w.turn.CompareAndSwap(turnHeldWaiting, turnHeld)
	}
	return err
}

// write opens f's stream and writes f, handing copies to QUIC only while
// it holds a send turn (see writeAndWait for the one wait it keeps it
// through, and openWaiting for one it does not); it reports
// false once the connection is gone, or is to be closed as a slow
// consumer (see openWaiting).
func (w *copyWriter) write(f *frame) bool {
	sc := w.sc
	st := &sc.l.stats
	if !w.take() {
		w.lost(f)
		return false
	}
	s, err := sc.c.qc.OpenUniStream()
	if err != nil {
		// No stream credit: the subscriber holds as many unread copies as
		// it allows. Wait for it without a turn.
		sc.wl.creditExhausted()
		w.give()
		if s, err = w.openWaiting(); err != nil {
			w.lost(f)
			return false
		}
		if !w.take() {
			s.CancelWrite(quic.StreamErrorCode(Canceled))
			w.lost(f)
			return false
		}
	}
	g := f.group
	watched := g != nil && sc.receipts != nil
	if watched {
		sc.receipts.watch(s.StreamID(), int64(len(f.buf)), g)
	}
	if sc.receipts != nil {
		// Bounded like the wait for stream credit (see openWaiting):
		// Write waits for the subscriber's flow-control credit.
		_ = s.SetWriteDeadline(time.Now().Add(sc.l.limits.SlowConsumerAfter))
	}
	wait := w.parked+1 >= maxParked || sc.q.waitingNone()
	if wait {
		err = w.writeAndWait(s, f.buf)
	} else {
		_, err = s.Write(f.buf)
	}
	if err == nil {
		err = s.Close()
	}
	now := sc.wl.now()
	w.done = sc.wl.at(now)
	stalled := false
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// Only a connection that tracks receipts sets a deadline.
			stalled = true
			sc.q.stall()
		}
		var se *quic.StreamError
		if errors.As(err, &se) && se.Remote {
			st.copiesRefused.Add(1) // the subscriber stopped the stream
		} else {
			s.CancelWrite(quic.StreamErrorCode(Canceled))
			st.dropped.connectionClosed.Add(1)
			f.lost()
		}
		if !watched || sc.receipts.forget(s.StreamID()) {
			g.settle(false)
		}
		sc.q.done(f)
	} else {
		st.copiesWritten.Add(1)
		if sc.wl.keepLast == 0 {
			// A copy is queued only after a SUBSCRIBE, which the
			// connection handles only after the peer's HELLO.
			sc.wl.setHold(sc.c.agreed.peerMaxTransfers)
		}
		sc.wl.written(f, now)
		sc.q.parked(f)
		w.parked++
		if g != nil && !watched {
			// Nothing records this connection's acknowledgements. On a
			// listener that tracks none, handed to QUIC is all it can
			// say; on one that tracks receipts, the connection predates
			// tracking and is being closed (see
			// Publisher.TrackReceipts): the copy is written and
			// unacknowledged on a connection that ends.
			g.settle(!sc.l.receipts.Load())
		}
	}
	f.release()
	if wait {
		sc.q.sent(w.parked)
		w.parked = 0
	}
	return !stalled
}

// openWaiting waits for the subscriber's stream credit to open f's
// stream. On a connection that tracks receipts it waits at most
// SlowConsumerAfter and then has the connection closed as a slow
// consumer: a subscriber that stopped reading holds its credit for good,
// the copies queued behind it would never be sent, and their broker
// messages, never acknowledged, would use up the broker's flow control
// and stop the resource. The default path waits as long as the
// connection lives: there the copies that do not fit are dropped, and
// the slow-consumer policy sees them (see sendQueue.noteStallLocked).
func (w *copyWriter) openWaiting() (*quic.SendStream, error) {
	sc := w.sc
	if sc.receipts == nil {
		return sc.c.qc.OpenUniStreamSync(sc.c.ctx)
	}
	ctx, cancel := context.WithTimeout(sc.c.ctx, sc.l.limits.SlowConsumerAfter)
	defer cancel()
	s, err := sc.c.qc.OpenUniStreamSync(ctx)
	if err != nil && sc.c.ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
		sc.q.stall()
	}
	return s, err
}

// lost counts f, popped and never written, as lost with its connection.
func (w *copyWriter) lost(f *frame) {
	w.sc.q.done(f)
	w.sc.l.stats.dropped.connectionClosed.Add(1)
	f.lost()
	f.group.settle(false)
	f.release()
}

// sendTurns limits how many connection writers hand copies to QUIC at
// once. Under a load the endpoint cannot send, every writer with a
// backlog would otherwise stay runnable, and a thousand of them would
// outnumber, on the Go scheduler's run queues, the few goroutines that
// read the sockets and process acknowledgements and keep-alives: readers
// lost their connections to the listener's idle timeout (issue 21). With
// turns, writers waiting for one are parked, not runnable, and a
// channel's waiters are served in order, so subscribers take turns
// fairly and the transport's goroutines are never outnumbered by more
// than the turns. A turn lasts until QUIC has packetized its copies
// (copyWriter.writeAndWait), so that the connection loops with copies to
// packetize are no more than the turns either.
type sendTurns chan struct{}

func newSendTurns() sendTurns { return make(sendTurns, 2*runtime.GOMAXPROCS(0)) }

// take waits for a turn; false when ctx ended first.
func (t sendTurns) take(ctx context.Context) bool {
	select {
	case t <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

func (t sendTurns) give() { <-t }
