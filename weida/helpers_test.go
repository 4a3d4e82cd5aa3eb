package weida

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"go.uber.org/goleak"

	"weida.dev/connector/weida/wire"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testTimeout bounds every wait in these tests; it is a safety net against
// hangs, never a measurement.
const testTimeout = 20 * time.Second

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// logBuffer is a concurrency-safe sink for slog text output.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func listen(t *testing.T, cfg ListenConfig) *Listener {
	t.Helper()
	l, err := Listen(testCtx(t), "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func publisher(t *testing.T, l *Listener, path string) *Publisher {
	t.Helper()
	p, err := l.Publisher(path)
	if err != nil {
		t.Fatalf("Publisher(%q): %v", path, err)
	}
	return p
}

// pinnedURL is the URL of path on l with l's fingerprint pinned.
func pinnedURL(l *Listener, path string) string {
	return fmt.Sprintf("weida://%s@%s%s", l.Fingerprint(), l.Addr(), path)
}

func dial(t *testing.T, l *Listener, path string, cfg DialConfig) *Subscriber {
	t.Helper()
	s, err := Dial(testCtx(t), pinnedURL(l, path), cfg)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// subscribe subscribes and waits until the listener holds want
// subscriptions in total, so that later publishes see them.
func subscribe(t *testing.T, l *Listener, s *Subscriber, want int64, filters ...string) {
	t.Helper()
	for _, f := range filters {
		if err := s.Subscribe(testCtx(t), f); err != nil {
			t.Fatalf("Subscribe(%q): %v", f, err)
		}
	}
	waitFor(t, fmt.Sprintf("%d subscriptions", want), func() bool { return l.Stats().Subscriptions == want })
}

// waitFor polls cond until it holds; the deadline only stops a hung test.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitForWithin(t, what, testTimeout, cond)
}

// waitForWithin is waitFor for an event that may take longer than
// testTimeout by design (it waits out a timeout of its own): d is still
// only a safety net.
func waitForWithin(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func receive(t *testing.T, s *Subscriber) Message {
	t.Helper()
	m, err := s.Receive(testCtx(t))
	if err != nil {
		t.Fatalf("Receive: %v", err)
	}
	return m
}

func publish(t *testing.T, p *Publisher, topic string, payload []byte) Result {
	t.Helper()
	r, err := p.Publish(testCtx(t), Message{Topic: topic, Payload: payload})
	if err != nil {
		t.Fatalf("Publish(%q): %v", topic, err)
	}
	return r
}

// raw is a hand-driven weida client over plain quic-go, for feeding a
// listener bytes no well-behaved peer would send.
type raw struct {
	t  *testing.T
	qc *quic.Conn
}

func rawTLS() *tls.Config {
	return &tls.Config{InsecureSkipVerify: true, NextProtos: []string{ALPN}, MinVersion: tls.VersionTLS13}
}

func quicDial(t *testing.T, l *Listener, tlsConf *tls.Config) (*quic.Conn, error) {
	return quicDialConfig(t, l, tlsConf, &quic.Config{MaxIncomingUniStreams: 1000})
}

// quicDialConfig is quicDial with QUIC settings of the test's own.
func quicDialConfig(t *testing.T, l *Listener, tlsConf *tls.Config, conf *quic.Config) (*quic.Conn, error) {
	qc, err := quic.DialAddr(testCtx(t), l.Addr().String(), tlsConf, conf)
	if err == nil {
		t.Cleanup(func() { _ = qc.CloseWithError(0, "") })
	}
	return qc, err
}

func rawDial(t *testing.T, l *Listener) *raw {
	t.Helper()
	qc, err := quicDial(t, l, rawTLS())
	if err != nil {
		t.Fatalf("raw dial: %v", err)
	}
	return &raw{t: t, qc: qc}
}

// frame builds preamble + header.
func frameOf(k wire.Kind, hdr []byte) []byte { return wire.AppendPreamble(nil, k, hdr) }

func helloFrame(h wire.Hello) []byte { return frameOf(wire.KindHello, wire.AppendHello(nil, &h)) }

func subscribeFrame(k wire.Kind, path, filter string) []byte {
	return frameOf(k, wire.AppendSubscribe(nil, &wire.Subscribe{Endpoint: path, Filter: filter}))
}

func dataFrame(path, topic string, payload []byte) []byte {
	b := frameOf(wire.KindData, wire.AppendData(nil, &wire.Data{Endpoint: path, HasEndpoint: true, Topic: topic, HasTopic: true}))
	return append(b, payload...)
}

// send opens a uni stream, writes b and FINs it.
func (r *raw) send(b []byte) *quic.SendStream {
	r.t.Helper()
	st, err := r.qc.OpenUniStreamSync(testCtx(r.t))
	if err != nil {
		r.t.Fatalf("raw open: %v", err)
	}
	if _, err := st.Write(b); err != nil {
		r.t.Fatalf("raw write: %v", err)
	}
	if err := st.Close(); err != nil {
		r.t.Fatalf("raw close: %v", err)
	}
	return st
}

// sendOpen opens a uni stream and writes b without a FIN, so that the
// stream's context reports the peer's STOP_SENDING (a FIN would end it
// first).
func (r *raw) sendOpen(b []byte) *quic.SendStream {
	r.t.Helper()
	st, err := r.qc.OpenUniStreamSync(testCtx(r.t))
	if err != nil {
		r.t.Fatalf("raw open: %v", err)
	}
	if _, err := st.Write(b); err != nil {
		r.t.Fatalf("raw write: %v", err)
	}
	return st
}

func (r *raw) hello() { r.send(helloFrame(wire.NewHello(16384, 1024))) }

// closed waits for the connection to end and returns the application code
// it was closed with.
func (r *raw) closed() *quic.ApplicationError {
	r.t.Helper()
	select {
	case <-r.qc.Context().Done():
	case <-time.After(testTimeout):
		r.t.Fatal("connection was not closed")
	}
	var ae *quic.ApplicationError
	if !errors.As(context.Cause(r.qc.Context()), &ae) {
		r.t.Fatalf("connection ended with %v, not an application close", context.Cause(r.qc.Context()))
	}
	return ae
}

// stopCode waits until the peer stops st and returns the STOP_SENDING code.
func stopCode(t *testing.T, st *quic.SendStream) quic.StreamErrorCode {
	t.Helper()
	return stopCodeCtx(t, st.Context())
}

// stopCodeCtx waits for a send half's context and returns the STOP_SENDING
// code it ended with.
func stopCodeCtx(t *testing.T, ctx context.Context) quic.StreamErrorCode {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-time.After(testTimeout):
		t.Fatal("stream was not stopped")
	}
	var se *quic.StreamError
	if !errors.As(context.Cause(ctx), &se) || !se.Remote {
		t.Fatalf("stream context ended with %v, not a remote STOP_SENDING", context.Cause(ctx))
	}
	return se.ErrorCode
}

// nextData accepts uni streams until one carries DATA (skipping the
// listener's HELLO) and returns its header and payload.
func (r *raw) nextData() (wire.Data, []byte) {
	r.t.Helper()
	for {
		st, err := r.qc.AcceptUniStream(testCtx(r.t))
		if err != nil {
			r.t.Fatalf("raw accept: %v", err)
		}
		k, hdr, err := wire.ReadPreamble(st, 16384, nil)
		if err != nil {
			r.t.Fatalf("raw read preamble: %v", err)
		}
		if k == wire.KindHello {
			continue
		}
		if k != wire.KindData {
			r.t.Fatalf("raw got kind %v", k)
		}
		d, err := wire.DecodeData(hdr)
		if err != nil {
			r.t.Fatalf("raw decode DATA: %v", err)
		}
		payload, err := io.ReadAll(st)
		if err != nil {
			r.t.Fatalf("raw read payload: %v", err)
		}
		return d, payload
	}
}

// rawServer is a hand-driven weida listener over plain quic-go, for feeding
// a Subscriber bytes no well-behaved publisher would send. It serves one
// connection.
type rawServer struct {
	t  *testing.T
	ln *quic.Listener
	wg sync.WaitGroup
}

func rawListen(t *testing.T) *rawServer {
	t.Helper()
	cert, err := selfSigned()
	if err != nil {
		t.Fatal(err)
	}
	conf := &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{ALPN}, MinVersion: tls.VersionTLS13}
	ln, err := quic.ListenAddr("127.0.0.1:0", conf, &quic.Config{MaxIncomingUniStreams: 1000})
	if err != nil {
		t.Fatal(err)
	}
	s := &rawServer{t: t, ln: ln}
	t.Cleanup(func() {
		_ = ln.Close()
		s.wg.Wait()
	})
	return s
}

func (s *rawServer) url(path string) string { return "weida://" + s.ln.Addr().String() + path }

// start accepts one connection in a new goroutine, runs handle on it, and
// keeps the connection until the peer closes it or the test ends.
func (s *rawServer) start(handle func(qc *quic.Conn)) {
	s.wg.Go(func() { s.serve(handle) })
}

func (s *rawServer) serve(handle func(qc *quic.Conn)) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	qc, err := s.ln.Accept(ctx)
	if err != nil {
		return
	}
	defer qc.CloseWithError(0, "")
	handle(qc)
	select {
	case <-qc.Context().Done():
	case <-ctx.Done():
	}
}

// sendUni opens a uni stream, writes b and FINs it; failures are left for
// the caller to observe on the connection.
func sendUni(qc *quic.Conn, b []byte) *quic.SendStream {
	st, err := qc.OpenUniStreamSync(qc.Context())
	if err != nil {
		return nil
	}
	_, _ = st.Write(b)
	_ = st.Close()
	return st
}

// sendUniOpen is sendUni without the FIN.
func sendUniOpen(qc *quic.Conn, b []byte) *quic.SendStream {
	st, err := qc.OpenUniStreamSync(qc.Context())
	if err != nil {
		return nil
	}
	_, _ = st.Write(b)
	return st
}

// appErr returns the application close of a finished connection, or nil.
func appErr(qc *quic.Conn) *quic.ApplicationError {
	var ae *quic.ApplicationError
	if errors.As(context.Cause(qc.Context()), &ae) {
		return ae
	}
	return nil
}

// streamCode returns the STOP_SENDING code a send stream's context ended
// with, or 1<<62 when it ended otherwise.
func streamCode(ctx context.Context) quic.StreamErrorCode {
	var se *quic.StreamError
	if errors.As(context.Cause(ctx), &se) {
		return se.ErrorCode
	}
	return 1 << 62
}
