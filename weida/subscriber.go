package weida

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

	"weida.dev/connector/weida/address"
	"weida.dev/connector/weida/topic"
	"weida.dev/connector/weida/wire"
)

// Subscriber is one dialled connection to a publisher path: weida keeps one
// QUIC connection per dialled path (PROTOCOL §2.5). It sends SUBSCRIBE and
// UNSUBSCRIBE for that path and receives the copies the publisher fans out.
//
// Nothing survives the connection (PROTOCOL §11): once [Subscriber.Done] is
// closed, dial again and subscribe again. Its methods are safe for
// concurrent use. Every goroutine it starts has ended when Close returns.
//
// While it holds a filter and hears nothing from the publisher for
// [DialConfig].ProbeAfter, it sends liveness probes, so that a publisher
// restarted with its stateless reset key ends the old connection at once.
//
// [Subscriber.Close] drops the copies still on their way;
// [Subscriber.Shutdown] withdraws every filter and keeps delivering until
// the publisher has gone quiet, so that a subscriber that leaves on purpose
// loses none of the copies the publisher already sent it.
type Subscriber struct {
	addr   address.Address
	limits Limits
	log    *slog.Logger
	udp    *net.UDPConn
	tr     *quic.Transport
	c      *conn

	queue recvQueue // arrived copies, still unread in QUIC

	subMu   sync.Mutex
	filters map[string]struct{}

	// orderMu is held from deciding to send a SUBSCRIBE or UNSUBSCRIBE
	// (by Subscribe, Unsubscribe, a probe or Shutdown) until its frame is
	// written, so that frames leave in the order their decisions were
	// taken: a probe's re-SUBSCRIBE of a filter can then never be opened
	// after the UNSUBSCRIBE that withdrew it.
	orderMu  sync.Mutex
	shutting atomic.Bool // orderMu to set; Shutdown has begun: nothing is subscribed or probed any more

	probeAfter time.Duration // silence before a liveness probe; 0: never
	stopProbe  chan struct{} // closed by Shutdown

	end       *subEnd
	closeOnce sync.Once
	wg        sync.WaitGroup

	received, tooLarge, resets, refused atomic.Uint64
	probes                              atomic.Uint64
	unread                              atomic.Uint64 // see SubscriberStats.DroppedUnread
	arrived                             atomic.Uint64 // copies taken from the connection, for Shutdown's quiet period
	watched                             atomic.Uint64 // reads of a copy that had to watch ctx (see copyReader)
}

// inbound is an arrived copy whose header is decoded; all of its bytes are
// still in QUIC's buffers, the first n of them preamble and header.
type inbound struct {
	st *quic.ReceiveStream
	n  int
	d  wire.Data
}

// Dial connects to a publisher path, "weida://[sha256:<hex>@]host:port/path",
// and completes the HELLO exchange. ctx bounds the whole dial, handshake and
// negotiation included.
//
// The publisher is trusted by the fingerprint pinned in the URL, else by
// cfg.CAFile (its chain must reach the file's anchors and name the URL's
// host), else, in tests, by cfg.InsecureSkipVerifyForTesting; with none of
// them Dial fails with [ErrNoTrust] and says how to pin. A listener that
// admits only listed client certificates and not this client's (or this
// client without one) fails Dial with [ErrClientRefused]. A host name is
// resolved and its first address dialled.
func Dial(ctx context.Context, rawURL string, cfg DialConfig) (*Subscriber, error) {
	a, err := address.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	limits, err := cfg.Limits.withDefaults(false)
	if err != nil {
		return nil, err
	}
	probeAfter := cfg.ProbeAfter
	switch {
	case probeAfter == 0:
		probeAfter = DefaultProbeAfter
	case probeAfter < 0:
		probeAfter = 0
	}
	tlsConf, clientFP, err := clientTLS(a, &cfg)
	if err != nil {
		return nil, err
	}
	ua, err := resolve(ctx, a)
	if err != nil {
		return nil, fmt.Errorf("weida: dial %s: %w", a, err)
	}
	udp, err := net.ListenUDP("udp", nil)
	if err != nil {
		return nil, fmt.Errorf("weida: dial %s: %w", a, err)
	}
	tr := &quic.Transport{Conn: udp}
	qconf := limits.quicConfig()
	qconf.Tracer = cfg.QUICTracer
	qc, err := tr.Dial(ctx, ua, tlsConf, qconf)
	if err != nil {
		_ = tr.Close()
		_ = udp.Close()
		if refusedClient(err) {
			err = clientRefused(closeErrorOf(err), clientFP)
		}
		return nil, fmt.Errorf("weida: dial %s: %w", a, err)
	}
	if p := qc.ConnectionState().TLS.NegotiatedProtocol; p != ALPN {
		_ = qc.CloseWithError(quic.ApplicationErrorCode(ProtocolViolation), "ALPN must be "+ALPN)
		_ = tr.Close()
		_ = udp.Close()
		return nil, fmt.Errorf("weida: dial %s: negotiated ALPN %q, not %q", a, p, ALPN)
	}
	s := &Subscriber{
		addr:       a,
		limits:     limits,
		log:        loggerOrDiscard(cfg.Logger).With("url", a.String()),
		udp:        udp,
		tr:         tr,
		queue:      recvQueue{ready: make(chan struct{}, 1)},
		filters:    make(map[string]struct{}),
		probeAfter: probeAfter,
		stopProbe:  make(chan struct{}),
	}
	s.c = newConn(qc, &s.limits, s.log, s, &connHooks{refused: &s.refused})
	s.end = &subEnd{ctx: s.c.ctx}
	s.c.start()
	s.wg.Go(s.supervise)
	select {
	case <-s.c.helloDone:
		if s.probeAfter > 0 {
			s.wg.Go(s.probe)
		}
		return s, nil
	case <-s.c.ctx.Done():
		err = s.connErr()
		if refusedClient(err) {
			err = clientRefused(err, clientFP)
		}
	case <-ctx.Done():
		err = ctx.Err()
	}
	_ = s.Close()
	return nil, fmt.Errorf("weida: dial %s: %w", a, err)
}

// PeerExtensions returns the extension keys (64 and up) of the publisher's
// HELLO, ascending, each with its encoded CBOR value; nil when it sent
// none. PROTOCOL §5 has a peer skip keys it does not know, so they change
// nothing about the connection: they only describe the publisher.
func (s *Subscriber) PeerExtensions() []wire.Extension { return s.c.agreed.peerExtensions }

// LastValueAd is the publisher's last-value advertisement (HELLO extension
// key 64, see docs/WEIDA.md).
type LastValueAd = wire.LastValueAd

// PeerReplays returns the publisher's last-value advertisement and true
// when it says the dialled path replays last values to new subscriptions
// (the path is listed, or the publisher listed no paths). An advertisement
// whose value does not decode is treated as absent and logged.
func (s *Subscriber) PeerReplays() (LastValueAd, bool) {
	v := wire.Hello{Extensions: s.PeerExtensions()}
	b := v.Extension(wire.HelloLastValue)
	if b == nil {
		return LastValueAd{}, false
	}
	ad, err := wire.DecodeLastValueAd(b)
	if err != nil {
		s.log.Warn("weida: ignoring the publisher's last-value advertisement, which does not decode", "err", err)
		return LastValueAd{}, false
	}
	return ad, ad.Covers(s.addr.Path)
}

// resolve returns the UDP address to dial: the host itself when it is an IP
// literal, else the first address the resolver returns.
func resolve(ctx context.Context, a address.Address) (*net.UDPAddr, error) {
	if ip, err := netip.ParseAddr(a.Host); err == nil {
		return net.UDPAddrFromAddrPort(netip.AddrPortFrom(ip, uint16(a.Port))), nil
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", a.Host)
	if err != nil {
		return nil, err
	}
	if len(ips) == 0 {
		return nil, fmt.Errorf("no address for %s", a.Host)
	}
	return net.UDPAddrFromAddrPort(netip.AddrPortFrom(ips[0].Unmap(), uint16(a.Port))), nil
}

// supervise waits for the connection to end, then drops the copies that
// were waiting and the connection's goroutines.
func (s *Subscriber) supervise() {
	<-s.c.ctx.Done()
	s.c.wait()
	s.unread.Add(uint64(s.queue.clear()))
	if !s.end.closing.Load() {
		s.log.Info("weida: connection to publisher lost", "cause", s.connErr())
	}
}

// Path returns the dialled publisher path.
func (s *Subscriber) Path() string { return s.addr.Path }

// URL returns the weida URL dialled, as [address.Address.String] formats
// it: with a [Failover], the address that answered.
func (s *Subscriber) URL() string { return s.addr.String() }

// subEnd is how a Subscriber's connection ended, apart from the
// Subscriber, so that a [Failover] can ask after it without keeping the
// Subscriber and its unread copies alive.
type subEnd struct {
	ctx       context.Context // the connection's
	closing   atomic.Bool
	lostFirst atomic.Bool // the connection had ended when Close began: it was lost, not closed
}

// lost reports whether the connection ended other than by Close or
// Shutdown: the publisher closed it, or it was reset or timed out.
func (e *subEnd) lost() bool {
	if e.closing.Load() {
		return e.lostFirst.Load()
	}
	return e.ctx.Err() != nil
}

// Subscribe asks the publisher for the topics filter selects on the dialled
// path. The filter is checked against the grammar first (an illegal filter
// would make the publisher close the whole connection), and so is the
// Limits.MaxSubscriptions count ([ErrTooManySubscriptions]). Subscribing to
// a filter already held is a no-op. After Close, or once Shutdown has
// begun, Subscribe fails with [ErrClosed].
//
// Subscribe returns once the SUBSCRIBE frame is written; weida has no
// acknowledgement, and copies published before the publisher reads it are
// not delivered. QUIC orders no stream against another, so a Subscribe and
// Unsubscribe of one filter issued back to back may reach the publisher in
// either order.
func (s *Subscriber) Subscribe(ctx context.Context, filter string) error {
	if err := topic.ValidateFilter(filter); err != nil {
		return fmt.Errorf("weida: subscribe: %w", err)
	}
	s.orderMu.Lock()
	defer s.orderMu.Unlock()
	if s.shutting.Load() {
		return fmt.Errorf("weida: subscribe %q: %w", filter, ErrClosed)
	}
	s.subMu.Lock()
	if _, ok := s.filters[filter]; ok {
		s.subMu.Unlock()
		return nil
	}
	if len(s.filters) >= s.limits.MaxSubscriptions {
		s.subMu.Unlock()
		return fmt.Errorf("weida: subscribe %q: %w (%d)", filter, ErrTooManySubscriptions, s.limits.MaxSubscriptions)
	}
	s.filters[filter] = struct{}{}
	s.subMu.Unlock()
	if err := s.sendSubscription(ctx, wire.KindSubscribe, filter, 0, nil); err != nil {
		s.subMu.Lock()
		delete(s.filters, filter)
		s.subMu.Unlock()
		return fmt.Errorf("weida: subscribe %q: %w", filter, err)
	}
	return nil
}

// Unsubscribe withdraws a filter. Withdrawing one not held (or not valid) is
// a no-op. Copies already on their way may still arrive.
//
// A liveness probe re-sends the SUBSCRIBE of a held filter (see
// [DialConfig].ProbeAfter). Unsubscribe never sends its UNSUBSCRIBE before
// a probe of the same filter that was already under way, but QUIC orders no
// stream against another: should the probe's packet be lost and repeated
// after the UNSUBSCRIBE arrived, the publisher would hold the filter again.
// This needs a probe (so 750 ms without any packet from the publisher by
// default), an Unsubscribe right after it, and a lost packet in between.
func (s *Subscriber) Unsubscribe(ctx context.Context, filter string) error {
	s.orderMu.Lock()
	defer s.orderMu.Unlock()
	s.subMu.Lock()
	if _, ok := s.filters[filter]; !ok {
		s.subMu.Unlock()
		return nil
	}
	delete(s.filters, filter)
	s.subMu.Unlock()
	if err := s.sendSubscription(ctx, wire.KindUnsubscribe, filter, 0, nil); err != nil {
		return fmt.Errorf("weida: unsubscribe %q: %w", filter, err)
	}
	return nil
}

// sendSubscription writes one SUBSCRIBE or UNSUBSCRIBE on a stream of its
// own, its header padded with pad bytes when the publisher's
// max_header_bytes leaves room for them (see wire.AppendSubscribePadded).
// s.orderMu must be held.
func (s *Subscriber) sendSubscription(ctx context.Context, k wire.Kind, filter string, pad int, written func()) error {
	if s.end.closing.Load() {
		return ErrClosed
	}
	sub := wire.Subscribe{Endpoint: s.addr.Path, Filter: filter}
	hdr := wire.AppendSubscribePadded(make([]byte, 0, 16+len(s.addr.Path)+len(filter)+pad), &sub, pad)
	if pad > 0 && uint64(len(hdr)) > s.c.agreed.sendMaxHeaderBytes {
		hdr = wire.AppendSubscribe(hdr[:0], &sub)
	}
	if uint64(len(hdr)) > s.c.agreed.sendMaxHeaderBytes {
		return fmt.Errorf("header of %d bytes exceeds the publisher's max_header_bytes %d", len(hdr), s.c.agreed.sendMaxHeaderBytes)
	}
	st, err := s.c.qc.OpenUniStreamSync(ctx)
	if err != nil {
		return s.sendErr(err)
	}
	if d, ok := ctx.Deadline(); ok {
		_ = st.SetWriteDeadline(d)
	}
	if _, err := st.Write(wire.AppendPreamble(make([]byte, 0, len(hdr)+4), k, hdr)); err != nil {
		st.CancelWrite(quic.StreamErrorCode(Canceled))
		return s.sendErr(refusal(st, err))
	}
	if written != nil {
		// Handed to QUIC: a Close that fails now (the connection ended,
		// perhaps by the very reset this stream drew) does not unsend it.
		written()
	}
	if err := st.Close(); err != nil {
		return s.sendErr(refusal(st, err))
	}
	return nil
}

// refusal returns ErrSubscriptionRefused, wrapping err, when the
// publisher stopped st with REJECTED; err otherwise. quic-go reports such
// a stop as a *quic.StreamError from Write, but as a plain error from a
// Close that comes after it; the stream's context keeps the stop itself.
func refusal(st *quic.SendStream, err error) error {
	var se *quic.StreamError
	if errors.As(context.Cause(st.Context()), &se) && se.Remote && se.ErrorCode == quic.StreamErrorCode(Rejected) {
		return fmt.Errorf("%w: %w", ErrSubscriptionRefused, err)
	}
	return err
}

// sendErr prefers the connection's fate over a stream error it caused.
func (s *Subscriber) sendErr(err error) error {
	if s.c.ctx.Err() != nil {
		return s.closedErr()
	}
	return err
}

// Receive returns the next copy, waiting for one. It returns ctx's error
// when ctx ends first, [ErrClosed] after Close, and a [*CloseError] once
// the connection is lost. Copies arrive in any order (weida v0 orders no
// stream against another). A copy the publisher reset is discarded; one
// larger than Limits.MaxPayloadBytes is refused with STOP_SENDING(REJECTED)
// and counted; neither is returned.
//
// Receive reads the payload from QUIC only now, so a slow caller leaves
// copies unread and QUIC flow control pushes back on the publisher, which
// drops copies for this subscriber rather than buffering them here.
// Concurrent calls each get different copies.
//
// A ctx that ends while Receive reads a copy whose bytes have not all
// arrived abandons that copy: it is stopped with STOP_SENDING(CANCELED),
// counted in [SubscriberStats].DroppedUnread, and Receive returns ctx's
// error. Receive starts watching
// ctx for this only once such a read has waited 100 µs, so an end of ctx
// within that wait takes effect when it is over; a copy whose bytes have
// all arrived is returned even if ctx ended meanwhile.
func (s *Subscriber) Receive(ctx context.Context) (Message, error) {
	for {
		if in, ok := s.queue.pop(); ok {
			m, err := s.read(ctx, &in)
			s.queue.done()
			if errors.Is(err, errDiscarded) {
				continue
			}
			return m, err
		}
		select {
		case <-s.queue.ready:
		case <-ctx.Done():
			return Message{}, ctx.Err()
		case <-s.c.ctx.Done():
			return Message{}, s.closedErr()
		}
	}
}

var (
	errDiscarded = errors.New("weida: copy discarded")
	errTooLarge  = errors.New("weida: payload larger than MaxPayloadBytes")
)

// read reads one copy's payload to FIN.
func (s *Subscriber) read(ctx context.Context, in *inbound) (Message, error) {
	r := copyReader{st: in.st, ctx: ctx, watched: &s.watched}
	payload, err := readPayload(&r, in.n, s.limits.MaxPayloadBytes)
	if r.stop != nil {
		r.stop()
	}
	if err == nil {
		s.received.Add(1)
		return messageOf(&in.d, payload), nil
	}
	var se *quic.StreamError
	switch {
	case errors.Is(err, errTooLarge):
		s.tooLarge.Add(1)
		in.st.CancelRead(quic.StreamErrorCode(Rejected))
		s.log.Warn("weida: refused a copy larger than MaxPayloadBytes", "topic", in.d.Topic, "max_payload_bytes", s.limits.MaxPayloadBytes)
		return Message{}, errDiscarded
	case errors.As(err, &se) && se.Remote:
		s.resets.Add(1) // the publisher abandoned the copy: discard what was read
		return Message{}, errDiscarded
	case ctx.Err() != nil:
		s.unread.Add(1)
		in.st.CancelRead(quic.StreamErrorCode(Canceled))
		return Message{}, ctx.Err()
	case s.c.ctx.Err() != nil:
		s.unread.Add(1)
		return Message{}, s.closedErr()
	}
	in.st.CancelRead(quic.StreamErrorCode(Internal))
	return Message{}, fmt.Errorf("weida: reading a copy: %w", err)
}

// deadlineReader is the part of a quic.ReceiveStream that copyReader uses.
type deadlineReader interface {
	io.Reader
	SetReadDeadline(t time.Time) error
}

// copyReader reads one copy's stream for Receive so that the caller's ctx
// can end a read that waits for bytes still on their way, without paying
// for that on every copy. Watching ctx takes a context.AfterFunc (three
// allocations and a turn on the context's lock, about 6% of the CPU per
// copy when registered for each one), and it is needed only when a read
// would block: a copy's bytes have nearly always arrived by the time
// Receive reads it. So a cancellable ctx first gets a read deadline
// fastWait away; only when that passes with bytes missing is the deadline
// cleared and ctx watched, from then until the copy is read. A ctx that
// ends during the first fastWait therefore takes effect when fastWait
// ends. A ctx that can never end (Done returns nil) is not watched.
// Either way the first Read replaces whatever deadline the stream carries
// from the accept loop (see conn.uniFast).
//
// A copyReader belongs to one read of one copy; the zero value is not
// usable. After the read, call stop if it is set.
type copyReader struct {
	st      deadlineReader
	ctx     context.Context
	watched *atomic.Uint64 // counts the reads that had to watch ctx

	fast    bool        // the fastWait deadline is set
	endless bool        // ctx cannot end, and the deadline is cleared
	stop    func() bool // set once ctx is watched; it unregisters the watch
}

// Read reads from the stream as described on copyReader. Its only
// deadline error is the one a watched ctx causes by ending.
func (r *copyReader) Read(b []byte) (int, error) {
	if r.endless {
		return r.st.Read(b)
	}
	if r.stop == nil && !r.fast {
		if r.ctx.Done() == nil {
			r.endless = true
			_ = r.st.SetReadDeadline(time.Time{})
			return r.st.Read(b)
		}
		r.fast = true
		_ = r.st.SetReadDeadline(time.Now().Add(fastWait))
	}
	n, err := r.st.Read(b)
	if r.stop != nil || !errors.Is(err, os.ErrDeadlineExceeded) {
		return n, err
	}
	// Bytes are missing: wait for them as long as ctx lets us. The
	// deadline is cleared before ctx is watched, so that a ctx that ends
	// at once still sets its deadline last. (The closure takes the stream,
	// not r, which stays on the caller's stack.)
	_ = r.st.SetReadDeadline(time.Time{})
	st := r.st
	r.stop = context.AfterFunc(r.ctx, func() { _ = st.SetReadDeadline(time.Unix(1, 0)) })
	r.watched.Add(1)
	if n > 0 {
		return n, nil
	}
	return r.st.Read(b)
}

// readPayload reads a whole DATA stream whose first skip bytes are
// preamble and header, and returns the payload, at most max bytes of it.
// It reads into a pooled scratch buffer first, so that a copy that fits
// there costs one allocation of exactly its size; a larger one grows a
// slice of its own. The advisory content_len never sizes anything
// (PROTOCOL §6.2).
func readPayload(st *copyReader, skip int, max int64) ([]byte, error) {
	sp := scratchPool.Get().(*[scratchSize]byte)
	defer scratchPool.Put(sp)
	scratch := sp[:]
	limit := int64(skip) + max
	n := 0
	for n < len(scratch) {
		m, err := st.Read(scratch[n:])
		n += m
		if int64(n) > limit {
			return nil, errTooLarge
		}
		if err == io.EOF {
			if n < skip {
				return nil, io.ErrUnexpectedEOF // peeked bytes cannot vanish; only a reset takes them
			}
			return append([]byte(nil), scratch[skip:n]...), nil
		}
		if err != nil {
			return nil, err
		}
	}
	buf := make([]byte, n, min(int64(2*n), limit+1))
	copy(buf, scratch)
	for {
		if len(buf) == cap(buf) {
			nb := make([]byte, len(buf), min(int64(2*cap(buf)), limit+1))
			copy(nb, buf)
			buf = nb
		}
		m, err := st.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+m]
		if int64(len(buf)) > limit {
			return nil, errTooLarge
		}
		if err == io.EOF {
			return buf[skip:len(buf):len(buf)], nil
		}
		if err != nil {
			return nil, err
		}
	}
}

const scratchSize = 4096

var scratchPool = sync.Pool{New: func() any { return new([scratchSize]byte) }}

// Done is closed when the connection is gone, by Close or by loss.
func (s *Subscriber) Done() <-chan struct{} { return s.c.ctx.Done() }

// Err returns nil while the connection is up, [ErrClosed] after Close, and
// the [*CloseError] that ended it otherwise.
func (s *Subscriber) Err() error {
	if s.c.ctx.Err() == nil {
		return nil
	}
	return s.closedErr()
}

func (s *Subscriber) closedErr() error {
	if s.end.closing.Load() {
		return ErrClosed
	}
	return s.connErr()
}

// connErr converts the connection's close cause.
func (s *Subscriber) connErr() error { return closeErrorOf(context.Cause(s.c.ctx)) }

// refusedClient reports whether err is the listener's TLS refusal of the
// client: the alert bad_certificate (42), which a weida Listener sends for
// a client certificate missing or not listed in its ClientFingerprints, or
// certificate_required (116), which a listener that simply requires a
// certificate sends when none is presented. A TLS 1.3 client has finished
// its handshake before the listener checks its certificate, so the refusal
// can arrive during Dial or just after it; either way no weida frame was
// exchanged.
func refusedClient(err error) bool {
	var te *quic.TransportError
	if !errors.As(err, &te) || !te.Remote {
		return false
	}
	return te.ErrorCode == 0x100+42 || te.ErrorCode == 0x100+116
}

// clientRefused wraps the close error of a listener's refusal of this
// client with [ErrClientRefused] and what to do about it; clientFP is the
// fingerprint of the certificate presented, "" for none.
func clientRefused(err error, clientFP string) error {
	if clientFP == "" {
		return fmt.Errorf("%w: none was presented, and this listener admits only clients whose "+
			"certificate fingerprint it lists (set DialConfig.CertFile and KeyFile to a listed certificate): %w",
			ErrClientRefused, err)
	}
	return fmt.Errorf("%w %s: this listener admits only the client fingerprints it lists, "+
		"and not this one (have it added to the listener's ClientFingerprints, or present a listed certificate): %w",
		ErrClientRefused, clientFP, err)
}

// closeErrorOf turns quic-go's connection close cause into a *CloseError.
func closeErrorOf(cause error) *CloseError {
	var ae *quic.ApplicationError
	if errors.As(cause, &ae) {
		return &CloseError{Code: Code(ae.ErrorCode), Reason: ae.ErrorMessage, Remote: ae.Remote}
	}
	remote := false
	var te *quic.TransportError
	if errors.As(cause, &te) {
		remote = te.Remote
	}
	reason := "connection lost"
	if cause != nil {
		reason = cause.Error()
	}
	return &CloseError{Code: Internal, Reason: reason, Remote: remote, Err: cause}
}

// SubscriberStats is a snapshot of a Subscriber's counters.
type SubscriberStats struct {
	Received       uint64 // copies returned by Receive
	DroppedTooBig  uint64 // copies refused for exceeding MaxPayloadBytes
	DroppedReset   uint64 // copies the publisher reset before FIN
	StreamsRefused uint64 // streams refused per PROTOCOL §9.4 (wrong path, exchanges)
	// DroppedUnread counts copies that arrived (their header was read)
	// but were never returned by Receive: the connection ended, by Close
	// or by a loss, while they waited or were being read, or the caller's
	// ctx ended while Receive read one. weida has no acknowledgement, so
	// the publisher counted them as written; this is the only record of
	// their loss. Read it after Close to count everything.
	DroppedUnread uint64
	// Probes counts the liveness probes sent (see [DialConfig].ProbeAfter).
	Probes uint64
}

// Stats returns the subscriber's counters.
func (s *Subscriber) Stats() SubscriberStats {
	return SubscriberStats{
		Received:       s.received.Load(),
		DroppedTooBig:  s.tooLarge.Load(),
		DroppedReset:   s.resets.Load(),
		StreamsRefused: s.refused.Load(),
		DroppedUnread:  s.unread.Load(),
		Probes:         s.probes.Load(),
	}
}

// Close closes the connection with NO_ERROR and waits for the subscriber's
// goroutines. Copies still on their way from the publisher are lost, and
// those that arrived but were not returned by Receive are counted in
// [SubscriberStats].DroppedUnread; [Subscriber.Shutdown] receives them
// first. Later calls return nil.
func (s *Subscriber) Close() error {
	s.closeOnce.Do(func() {
		s.end.lostFirst.Store(s.c.ctx.Err() != nil)
		s.end.closing.Store(true)
		s.c.close(NoError, "")
		s.wg.Wait()
		_ = s.tr.Close()
		_ = s.udp.Close()
	})
	return nil
}

// minQuiet is the shortest silence after which Shutdown takes the
// publisher to be done sending; see Shutdown for the longer one.
const minQuiet = 100 * time.Millisecond

// Shutdown leaves the publisher without losing what it already sent: it
// sends UNSUBSCRIBE for every held filter, keeps accepting copies and
// handing them to [Subscriber.Receive] until no copy has arrived for a
// quiet period (the larger of 100 ms and four smoothed round-trip times)
// with none waiting to be returned by Receive,
// and then closes the connection with NO_ERROR like [Subscriber.Close].
//
// The copies a publisher wrote before it applied the UNSUBSCRIBE (and, for
// a weida Listener, those still in its send queue then) arrive meanwhile,
// so call Receive from another goroutine until it returns [ErrClosed];
// without a reader Shutdown waits for ctx. When ctx ends first, Shutdown
// closes at once and returns ctx's error; the copies still unread are
// counted in [SubscriberStats].DroppedUnread, as Close counts them.
//
// Once Shutdown has begun, Subscribe fails with ErrClosed and no liveness
// probe is sent. A connection already lost ends Shutdown at once (it
// returns nil; [Subscriber.Err] says what happened). A second call waits
// for the first, and Close ends a Shutdown in progress.
func (s *Subscriber) Shutdown(ctx context.Context) error {
	s.orderMu.Lock()
	first := !s.shutting.Swap(true)
	if !first {
		s.orderMu.Unlock()
		select {
		case <-s.c.ctx.Done():
		case <-ctx.Done():
			_ = s.Close()
			return ctx.Err()
		}
		_ = s.Close()
		return nil
	}
	close(s.stopProbe)
	s.subMu.Lock()
	filters := make([]string, 0, len(s.filters))
	for f := range s.filters {
		filters = append(filters, f)
	}
	clear(s.filters)
	s.subMu.Unlock()
	for _, f := range filters {
		// A failure means the connection or ctx is gone; drain says which.
		if s.sendSubscription(ctx, wire.KindUnsubscribe, f, 0, nil) != nil {
			break
		}
	}
	s.orderMu.Unlock()
	err := s.drain(ctx, filters)
	_ = s.Close()
	return err
}

// drain waits until no copy has arrived for the quiet period while no
// arrived copy waited for Receive or was being read, or until the
// connection or ctx ends. Quiet is about copies, not packets: a Listener's
// keep-alive PINGs arrive every 500 ms or so, and on a path whose four
// round trips exceed that gap, packets would never fall quiet. The quiet
// period restarts while copies wait, because reading them returns stream
// credit, and the copies the publisher held back for it come a round trip
// later.
//
// While copies keep coming, the UNSUBSCRIBEs go again every eight quiet
// periods: a liveness probe sent before Shutdown is a SUBSCRIBE of a held
// filter, and if its packet was lost and QUIC resent it after the
// UNSUBSCRIBE arrived, the publisher holds the filter again and the copies
// would never stop. An UNSUBSCRIBE of a filter no longer held is ignored
// (PROTOCOL §6.4), so resending costs nothing else.
func (s *Subscriber) drain(ctx context.Context, filters []string) error {
	quiet := max(minQuiet, 4*s.c.qc.ConnectionStats().SmoothedRTT)
	tick := time.NewTicker(max(quiet/4, time.Millisecond))
	defer tick.Stop()
	seen := s.arrived.Load()
	quietSince := time.Now()
	resendAt := quietSince.Add(8 * quiet)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.c.ctx.Done():
			return nil
		case now := <-tick.C:
			if n := s.arrived.Load(); n != seen || s.queue.pending() > 0 {
				seen, quietSince = n, now
				if now.After(resendAt) {
					resendAt = now.Add(8 * quiet)
					s.unsubscribeAgain(ctx, filters)
				}
				continue
			}
			if now.Sub(quietSince) >= quiet {
				return nil
			}
		}
	}
}

// unsubscribeAgain resends the UNSUBSCRIBEs of a Shutdown (see drain).
func (s *Subscriber) unsubscribeAgain(ctx context.Context, filters []string) {
	s.orderMu.Lock()
	defer s.orderMu.Unlock()
	for _, f := range filters {
		if s.sendSubscription(ctx, wire.KindUnsubscribe, f, 0, nil) != nil {
			return
		}
	}
}

// data takes a uni DATA stream: a copy for the dialled path is queued,
// unread, for Receive; any other path is refused with UNKNOWN_ENDPOINT
// (PROTOCOL §9.4). The queue needs no bound of its own: every entry holds
// an unfinished stream, so the peer's stream credit
// (MaxConcurrentUniStreams) bounds it, and QUIC's windows bound its bytes.
func (s *Subscriber) data(c *conn, st *quic.ReceiveStream, n int, d wire.Data) {
	if d.Endpoint != s.addr.Path {
		c.refuse(st, UnknownEndpoint)
		return
	}
	s.arrived.Add(1)
	s.queue.push(inbound{st: st, n: n, d: d})
}

// recvQueue holds arrived copies in the order their headers were read
// (not publish order: see conn.uniFast). Its methods are safe for
// concurrent use.
type recvQueue struct {
	mu    sync.Mutex
	items []inbound // items[head:] wait
	head  int
	ready chan struct{} // capacity 1: "items may be waiting"
	// taken counts popped copies whose read has not ended (see done). pop
	// raises it under mu, together with taking the copy, so that pending
	// never misses a copy between the queue and its reader.
	taken atomic.Int64
}

func (q *recvQueue) push(in inbound) {
	q.mu.Lock()
	q.items = append(q.items, in)
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// pop takes the oldest copy, if any. It passes the wake-up on while more
// wait, so that concurrent Receive calls all make progress.
func (q *recvQueue) pop() (inbound, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.head == len(q.items) {
		return inbound{}, false
	}
	in := q.items[q.head]
	q.items[q.head] = inbound{}
	q.head++
	q.taken.Add(1)
	switch {
	case q.head == len(q.items):
		q.head, q.items = 0, q.items[:0]
	case q.head >= 256 && 2*q.head >= len(q.items):
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.head, q.items = 0, q.items[:n]
	default:
		select {
		case q.ready <- struct{}{}:
		default:
		}
	}
	return in, true
}

// done ends the read of a copy pop returned.
func (q *recvQueue) done() { q.taken.Add(-1) }

// pending returns how many copies wait or are being read.
func (q *recvQueue) pending() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items) - q.head + int(q.taken.Load())
}

// clear drops every waiting copy and returns how many there were.
func (q *recvQueue) clear() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := len(q.items) - q.head
	q.items, q.head = nil, 0
	return n
}

// subscription ignores SUBSCRIBE and UNSUBSCRIBE: a subscriber registers no
// publisher (PROTOCOL §6.4 lets such a peer ignore them).
func (s *Subscriber) subscription(*conn, *wire.Subscribe, bool) Code { return NoError }

func (s *Subscriber) serves(path string) bool { return path == s.addr.Path }
