package weida

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

	"weida.dev/connector/weida/wire"
)

// role is what differs between the two ends of a weida connection: the
// listener side (publisher paths, subscriptions, fan-out) and the dialling
// side (one subscribed path). Its methods run on the stream's own goroutine,
// after negotiation, and own the stream they are given.
type role interface {
	// data handles a uni DATA stream whose header decoded and names an
	// endpoint. Nothing of the stream is consumed yet: its first n bytes
	// are preamble and header, the payload follows. The stream may still
	// carry the accept loop's read deadline (see uniFast): whatever reads
	// it sets its own first. d is passed by value so that it does not
	// escape on the hot path.
	data(c *conn, st *quic.ReceiveStream, n int, d wire.Data)
	// subscription handles a decoded SUBSCRIBE (add) or UNSUBSCRIBE. A
	// code other than NoError refuses the stream with STOP_SENDING.
	subscription(c *conn, s *wire.Subscribe, add bool) Code
	// serves reports whether something is registered at path on this side
	// (a publisher, or the subscriber's own path), which decides between
	// UNSUPPORTED and UNKNOWN_ENDPOINT for a bidi exchange.
	serves(path string) bool
}

// conn is one weida connection of either role: the HELLO exchange, the
// parking of early streams, the hello timer, and the dispatch of every
// stream by kind (PROTOCOL §2.2, §3.2, §4, §9.4). It owns every goroutine it
// starts; wait returns once all of them have ended, which happens after
// the QUIC connection is closed.
type conn struct {
	qc     *quic.Conn
	ctx    context.Context // the QUIC connection's context, done once it is closed
	limits *Limits
	log    *slog.Logger
	role   role
	hooks  *connHooks

	local wire.Hello

	helloSeen atomic.Bool
	helloDone chan struct{} // closed when the peer's HELLO negotiated successfully
	agreed    agreed        // written once before helloDone is closed

	wg sync.WaitGroup
}

// connHooks are counters shared by the connections of one listener or
// subscriber; any may be nil.
type connHooks struct {
	parked     *atomic.Uint64 // streams that arrived before the peer's HELLO
	violations *atomic.Uint64 // connections closed with PROTOCOL_VIOLATION
	negFailed  *atomic.Uint64 // connections closed with NEGOTIATION_FAILED
	refused    *atomic.Uint64 // streams refused with STOP_SENDING or ERROR
}

func add(c *atomic.Uint64) {
	if c != nil {
		c.Add(1)
	}
}

func newConn(qc *quic.Conn, limits *Limits, log *slog.Logger, r role, hooks *connHooks) *conn {
	return &conn{
		qc:        qc,
		ctx:       qc.Context(),
		limits:    limits,
		log:       log.With("remote", qc.RemoteAddr().String()),
		role:      r,
		hooks:     hooks,
		local:     localHello(limits),
		helloDone: make(chan struct{}),
	}
}

// start sends our HELLO and starts accepting streams and the hello timer.
func (c *conn) start() {
	c.wg.Go(c.sendHello)
	c.wg.Go(c.helloTimer)
	c.wg.Go(c.acceptUni)
	c.wg.Go(c.acceptBidi)
}

// wait blocks until every goroutine of c has ended. They end once the QUIC
// connection is closed.
func (c *conn) wait() { c.wg.Wait() }

// negotiated reports whether the HELLO exchange has succeeded.
func (c *conn) negotiated() bool {
	select {
	case <-c.helloDone:
		return true
	default:
		return false
	}
}

// close closes the connection with code and a reason for the peer. It
// blocks until quic-go has sent CONNECTION_CLOSE; closing twice is harmless.
func (c *conn) close(code Code, reason string) {
	_ = c.qc.CloseWithError(quic.ApplicationErrorCode(code), reason)
}

// violation closes the connection with PROTOCOL_VIOLATION (PROTOCOL §3.2).
func (c *conn) violation(format string, args ...any) {
	reason := fmt.Sprintf(format, args...)
	if c.ctx.Err() == nil {
		add(c.hooks.violations)
		c.log.Warn("weida: closing connection: protocol violation", "reason", reason)
	}
	c.close(ProtocolViolation, reason)
}

func (c *conn) sendHello() {
	ctx, cancel := context.WithTimeout(c.ctx, c.limits.HelloTimeout)
	defer cancel()
	st, err := c.qc.OpenUniStreamSync(ctx)
	if err != nil {
		return // the connection is gone or the peer grants no stream: the hello timer decides
	}
	hdr := wire.AppendHello(make([]byte, 0, 32), &c.local)
	frame := wire.AppendPreamble(make([]byte, 0, len(hdr)+4), wire.KindHello, hdr)
	if _, err := st.Write(frame); err != nil {
		return
	}
	_ = st.Close()
}

func (c *conn) helloTimer() {
	t := time.NewTimer(c.limits.HelloTimeout)
	defer t.Stop()
	select {
	case <-c.helloDone:
	case <-c.ctx.Done():
	case <-t.C:
		if !c.negotiated() {
			add(c.hooks.negFailed)
			c.log.Warn("weida: closing connection: no HELLO within hello_timeout", "hello_timeout", c.limits.HelloTimeout)
			c.close(NegotiationFailed, "hello_timeout")
		}
	}
}

// acceptUni accepts the peer's uni streams. Once HELLO is done, a stream
// whose bytes are already here is handled right on this goroutine, which is
// the common case (a copy, a SUBSCRIBE) and costs no goroutine; a stream
// that would make it wait (bytes not yet arrived, the HELLO exchange not
// done) is handed to a goroutine of its own, so that no stream, however
// slow or hostile, delays the next. Waiting goroutines are bounded by the
// peer's stream credit.
func (c *conn) acceptUni() {
	sb := newStreamBuf()
	for {
		st, err := c.qc.AcceptUniStream(c.ctx)
		if err != nil {
			return
		}
		if !c.uniFast(st, sb) {
			c.wg.Go(func() { c.uni(st, newStreamBuf()) })
		}
		sb.reset()
	}
}

// fastWait is how long the accept loop lets a stream keep it: enough for
// bytes QUIC already holds, too short to matter when they are missing.
const fastWait = 100 * time.Microsecond

// uniFast handles st on the accept loop if that needs no waiting. It
// returns false, having consumed nothing, when st needs its own goroutine.
func (c *conn) uniFast(st *quic.ReceiveStream, sb *streamBuf) bool {
	if !c.negotiated() {
		return false // HELLO, and parking before it
	}
	_ = st.SetReadDeadline(time.Now().Add(fastWait))
	k, hdr, n, r := c.peekPreamble(st, sb)
	if r == peekOK && k == wire.KindData {
		// A copy keeps the deadline: the one read that follows, in
		// Receive, sets its own anyway, and clearing it here would cost
		// every copy a second turn on the stream's lock.
		c.dispatchUni(st, sb, k, hdr, n, false)
		return true
	}
	_ = st.SetReadDeadline(time.Time{})
	switch r {
	case peekWait:
		return false
	case peekGone:
		return true
	}
	if k == wire.KindHello {
		c.hello(st, sb, hdr, n) // a second one: a violation
		return true
	}
	c.dispatchUni(st, sb, k, hdr, n, false)
	return true
}

func (c *conn) acceptBidi() {
	for {
		st, err := c.qc.AcceptStream(c.ctx)
		if err != nil {
			return
		}
		c.wg.Go(func() { c.bidi(st) })
	}
}

// peeker is a QUIC receive half: quic.ReceiveStream and quic.Stream.
type peeker interface {
	io.Reader
	Peek(b []byte) (int, error)
}

type peekResult int

const (
	peekOK   peekResult = iota
	peekGone            // a violation closed the connection, or the stream or connection failed
	peekWait            // the read deadline passed before the bytes arrived; nothing consumed
)

// peekPreamble reads a stream's preamble and header WITHOUT consuming them:
// the bytes stay in QUIC's buffer, so the stream is not finished and keeps
// counting against the peer's stream credit until it is handled. (A
// consuming read of a copy with an empty payload would see the FIN at once,
// and QUIC would let the peer open another stream while this one still
// waits.) It returns the kind, the header (in sb's scratch) and the number
// of bytes preamble and header occupy. A violation closes the connection.
func (c *conn) peekPreamble(st peeker, sb *streamBuf) (wire.Kind, []byte, int, peekResult) {
	k, hdr, n, err := peekHeader(st, sb, c.limits.MaxHeaderBytes)
	if err == nil {
		return k, hdr, n, peekOK
	}
	// Only here: errors.As takes the address of we, which moves it to the
	// heap, and that would cost an allocation on every stream.
	var we *wire.Error
	switch {
	case errors.Is(err, errEmptyStream):
		c.violation("stream ends without a preamble")
	case errors.As(err, &we):
		c.violation("%v", we)
	case errors.Is(err, os.ErrDeadlineExceeded):
		return 0, nil, 0, peekWait
	}
	return 0, nil, 0, peekGone // a violation, or the stream was reset or the connection closed
}

var errEmptyStream = errors.New("weida: stream ends without a preamble")

// peekHeader peeks the preamble and header of st into sb. Its error is a
// *wire.Error or errEmptyStream for the peer's violations (PROTOCOL §3.1,
// §3.2), checked by wire's one preamble parser as early as the bytes allow:
// magic and kind before header_len, header_len against max before a buffer
// of that size exists. Any other error is the stream's own (a reset, a
// closed connection, a passed read deadline). It peeks at most three times:
// the fixed bytes, the rest of a longer header_len, the header.
func peekHeader(st peeker, sb *streamBuf, max uint64) (k wire.Kind, hdr []byte, n int, err error) {
	var b []byte
	for {
		need, err := wire.PreambleNeed(b, max)
		if err != nil {
			return 0, nil, 0, err
		}
		if need <= len(b) {
			return wire.ParsePreamble(b, max)
		}
		b = sb.grow(need)
		if m, err := st.Peek(b); m < len(b) {
			return 0, nil, 0, peekError(b[:m], err, max)
		}
	}
}

// peekError explains a preamble that could not be peeked whole: b is what
// arrived, err why no more did (io.EOF: the stream ended there). Bytes that
// already break a rule are the peer's violation whatever err is.
func peekError(b []byte, err error, max uint64) error {
	if len(b) == 0 && errors.Is(err, io.EOF) {
		return errEmptyStream
	}
	_, _, _, perr := wire.ParsePreamble(b, max)
	var we *wire.Error
	if errors.As(perr, &we) && (errors.Is(err, io.EOF) || we.Rule != wire.RuleTruncatedPreamble) {
		return we
	}
	if err == nil || errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF // unreachable: a short peek ends with an error
	}
	return err
}

// park holds a stream that arrived before the peer's HELLO until
// negotiation succeeds (PROTOCOL §2.2). It reports false if the connection
// ended first.
func (c *conn) park() bool {
	if c.negotiated() {
		return true
	}
	add(c.hooks.parked)
	select {
	case <-c.helloDone:
		return true
	case <-c.ctx.Done():
		return false
	}
}

// uni handles one uni stream on its own goroutine, waiting as needed.
func (c *conn) uni(st *quic.ReceiveStream, sb *streamBuf) {
	k, hdr, n, r := c.peekPreamble(st, sb)
	if r != peekOK {
		return
	}
	if k == wire.KindHello {
		c.hello(st, sb, hdr, n)
		return
	}
	if !c.park() {
		return
	}
	c.dispatchUni(st, sb, k, hdr, n, true)
}

// dispatchUni acts on a negotiated uni stream by kind (PROTOCOL §4, §9.4).
// wait says whether it runs on the stream's own goroutine and may block.
func (c *conn) dispatchUni(st *quic.ReceiveStream, sb *streamBuf, k wire.Kind, hdr []byte, n int, wait bool) {
	switch k {
	case wire.KindData:
		d, err := sb.decodeData(hdr)
		switch {
		case err != nil:
			c.violation("%v", err)
		case !d.HasEndpoint:
			c.violation("DATA without endpoint on a uni stream")
		default:
			c.role.data(c, st, n, d)
		}
	case wire.KindSubscribe, wire.KindUnsubscribe:
		s, err := wire.DecodeSubscribe(hdr)
		if err != nil {
			c.violation("%v", err)
			return
		}
		if code := c.role.subscription(c, &s, k == wire.KindSubscribe); code != NoError {
			c.refuse(st, code)
			return
		}
		c.finishHeaderOnly(st, sb, n, wait)
	case wire.KindCredit:
		// A peer without queues ignores credit (PROTOCOL §4).
		c.finishHeaderOnly(st, sb, n, wait)
	case wire.KindCursor:
		// We order no reports, so every report id is unknown (PROTOCOL §6.7).
		st.CancelRead(quic.StreamErrorCode(Canceled))
	case wire.KindFlow:
		c.violation("FLOW stream, but our HELLO lists no datagram capability")
	case wire.KindError:
		c.violation("ERROR frame on a uni stream")
	default:
		c.violation("frame kind %v on a uni stream", k) // unreachable: peekPreamble refuses reserved kinds
	}
}

// hello processes the peer's HELLO stream.
func (c *conn) hello(st *quic.ReceiveStream, sb *streamBuf, hdr []byte, n int) {
	if !c.helloSeen.CompareAndSwap(false, true) {
		c.violation("second HELLO")
		return
	}
	h, err := wire.DecodeHello(hdr)
	if err != nil {
		c.violation("%v", err)
		return
	}
	a, err := negotiate(&c.local, &h)
	if err != nil {
		add(c.hooks.negFailed)
		c.log.Warn("weida: closing connection: negotiation failed", "reason", err)
		c.close(NegotiationFailed, err.Error())
		return
	}
	c.agreed = a
	close(c.helloDone)
	c.finishHeaderOnly(st, sb, n, true)
}

// finishHeaderOnly ends a header-only stream whose first n bytes are
// preamble and header. If the FIN follows the header, it consumes the
// stream, so that QUIC returns the stream credit; if bytes follow, it stops
// the peer (PROTOCOL §4 lets a receiver stop reading after the header).
// Without wait it gives up after fastWait and finishes on a goroutine of
// its own.
func (c *conn) finishHeaderOnly(st *quic.ReceiveStream, sb *streamBuf, n int, wait bool) {
	if !wait {
		_ = st.SetReadDeadline(time.Now().Add(fastWait))
	}
	b := sb.grow(n + 1)
	m, err := st.Peek(b)
	if !wait {
		_ = st.SetReadDeadline(time.Time{})
	}
	switch {
	case m > n:
		st.CancelRead(quic.StreamErrorCode(NoError))
	case errors.Is(err, io.EOF):
		// Consume the header: reading up to io.EOF finishes the stream.
		for {
			if _, err := st.Read(b); err != nil {
				break
			}
		}
	case errors.Is(err, os.ErrDeadlineExceeded):
		c.wg.Go(func() { c.finishHeaderOnly(st, newStreamBuf(), n, true) })
	}
}

// bidi dispatches one accepted bidi stream. No path of this package serves
// an exchange, so every well-formed one is refused per PROTOCOL §9.4.
func (c *conn) bidi(st *quic.Stream) {
	sb := newStreamBuf()
	k, hdr, _, r := c.peekPreamble(st, sb)
	if r != peekOK {
		return
	}
	if !c.park() {
		return
	}
	if k != wire.KindData {
		c.violation("bidi stream opens with %v, not DATA", k)
		return
	}
	d, err := wire.DecodeData(hdr)
	switch {
	case err != nil:
		c.violation("%v", err)
		return
	case !d.HasEndpoint:
		c.violation("DATA without endpoint on a bidi stream")
		return
	}
	add(c.hooks.refused)
	code, errCode := UnknownEndpoint, wire.ErrorUnknownEndpoint
	if c.role.serves(d.Endpoint) {
		code, errCode = Unsupported, wire.ErrorUnsupported
	}
	st.CancelRead(quic.StreamErrorCode(code))
	hdrOut := wire.AppendErrorFrame(make([]byte, 0, 8), &wire.ErrorFrame{Code: errCode})
	if _, err := st.Write(wire.AppendPreamble(make([]byte, 0, 16), wire.KindError, hdrOut)); err == nil {
		_ = st.Close()
	}
}

// refuse stops a uni stream with code and counts it.
func (c *conn) refuse(st *quic.ReceiveStream, code Code) {
	add(c.hooks.refused)
	st.CancelRead(quic.StreamErrorCode(code))
}

// streamBuf is the scratch buffer a stream worker peeks preambles and
// headers into, and the last DATA header it decoded; each worker owns one.
type streamBuf struct {
	buf []byte

	lastHdr [lastHdrSize]byte // lastHdr[:lastLen] decoded into last
	lastLen int
	last    wire.Data
}

// lastHdrSize bounds the DATA header a streamBuf remembers: an ordinary
// copy's header (endpoint, content_len, topic, perhaps a content type) is
// well below it.
const lastHdrSize = 128

// streamBufSize fits the headers of ordinary copies and control frames;
// a larger header grows the buffer for as long as the stream needs it.
const streamBufSize = 256

func newStreamBuf() *streamBuf { return &streamBuf{buf: make([]byte, streamBufSize)} }

// grow returns the first n bytes of the scratch, enlarging it if needed.
func (sb *streamBuf) grow(n int) []byte {
	if n > len(sb.buf) {
		sb.buf = make([]byte, max(n, 2*len(sb.buf)))
	}
	return sb.buf[:n]
}

// decodeData decodes a DATA header, or returns what the last one decoded
// into when hdr is the same bytes. Consecutive copies of one publisher's
// messages often share their header (one topic, one size, the same
// metadata), and decoding one costs the validation of every key and an
// allocation for its strings, which a copy delivered by Receive then
// carries. A decoded header shares nothing that anyone writes to, so one
// value can serve any number of copies.
func (sb *streamBuf) decodeData(hdr []byte) (wire.Data, error) {
	if sb.lastLen > 0 && bytes.Equal(hdr, sb.lastHdr[:sb.lastLen]) {
		return sb.last, nil
	}
	d, err := wire.DecodeData(hdr)
	if err == nil && len(hdr) <= lastHdrSize {
		sb.lastLen = copy(sb.lastHdr[:], hdr)
		sb.last = d
	}
	return d, err
}

// reset drops a grown buffer, so that an idle worker does not pin a
// peer-sized header.
func (sb *streamBuf) reset() {
	if len(sb.buf) > streamBufSize {
		sb.buf = make([]byte, streamBufSize)
	}
}
