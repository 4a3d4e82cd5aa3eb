package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"weida.dev/connector/connectors"
)

// Sink publishes an outbound resource's messages to nats-server.
//
// Core NATS: Write returns once the server has read the publish, proved by
// a PING/PONG round trip after it on the same connection. Writes made while
// a round trip is under way wait together for the next one: a single
// goroutine publishes their messages back to back and confirms them all
// with one PING, so that many writers cost few round trips, few system
// calls and no contention on the connection. The server delivering the
// message to no subscriber is not an error (core NATS cannot tell); a
// publish the server's permissions refuse is a [connectors.Rejected] error
// (publish-denied), attributed from the server's asynchronous -ERR.
//
// JetStream (Config.JetStream set): Write publishes asynchronously and
// returns once the stream's PubAck arrives; the publish must land in
// Config.JetStream.Stream (the server refuses it otherwise).
//
// While the connection is down Write fails at once with an error wrapping
// [connectors.ErrNotConnected], and the runtime holds the message and tries
// again. A publish whose confirmation the connection's loss made uncertain
// is reported the same way, so a message may reach the server twice but is
// never reported published when it was not.
//
// Write may be called from many goroutines at once. A Write whose context
// ends before its round started withdraws its message; after that, the
// message may have been published although Write returned the context's
// error.
type Sink struct {
	cfg    Config
	report connectors.StateFunc
	log    *slog.Logger
	rlog   *connectors.RateLogger

	closed chan struct{}
	tr     *tracker
	once   sync.Once

	mu      sync.Mutex
	nc      *natsgo.Conn
	js      jetstream.JetStream
	running bool // Start succeeded

	// jsWrites counts the goroutines of JetStream WriteAsync calls, which
	// Close waits for. Added to under mu, and only while closed is open.
	// abandon ends their wait for a PubAck: Close closes it once the
	// outstanding PubAcks arrived or its ctx ended.
	jsWrites sync.WaitGroup
	abandon  chan struct{}

	// Flush rounds (core NATS).
	fmu      sync.Mutex
	next     *flushRound // the round not yet started, joined by new Writes
	stopped  bool        // the flusher has exited
	kick     chan struct{}
	stopping chan struct{}
	flusher  sync.WaitGroup

	published, rounds, bufferFull atomic.Uint64
	denials                       denials

	markerOnly natsgo.Header // read-only after NewSink; nil without a marker
}

// SinkStats are a Sink's counters since it was created.
type SinkStats struct {
	// Confirmed is how many Writes returned nil: publishes the server
	// confirmed (core: a PONG after them; JetStream: a PubAck).
	Confirmed uint64
	// FlushRounds is how many PING/PONG round trips confirmed them (core
	// NATS); Confirmed / FlushRounds is how many publishes a round trip
	// confirms on average.
	FlushRounds uint64
	// ReconnectBufferFull counts publishes refused because nats.go's
	// reconnect buffer was full ([ReasonReconnectBuffer]); the runtime
	// published each of them again later.
	ReconnectBufferFull uint64
}

// coreMessage builds the core NATS message for m. Messages whose only
// header is the loop marker share one header map, which nats.go only reads
// when it encodes a core publish.
func (s *Sink) coreMessage(m *connectors.Message) *natsgo.Msg {
	if m.ContentType == "" && m.Traceparent == "" && m.Tracestate == "" {
		return &natsgo.Msg{Subject: m.Topic, Data: m.Payload, Header: s.markerOnly}
	}
	return fromMessage(m, s.cfg.LoopMarker)
}

// flushRound is one PING/PONG round trip shared by the Writes that joined
// it before it started.
type flushRound struct {
	msgs  []*natsgo.Msg // guarded by Sink.fmu until the flusher takes the round; nil: withdrawn
	dones []func(error) // per message: WriteAsync's callback, nil for a Write

	// Set by the flusher, valid once done is closed.
	done                chan struct{}
	errs                []error // each message's publish error
	err                 error   // the round trip's error
	genBefore, genAfter uint64  // the reconnect count before the publishes and after the PONG
}

var (
	_ connectors.Sink        = (*Sink)(nil)
	_ connectors.AsyncWriter = (*Sink)(nil)
)

// NewSink checks cfg and returns a Sink; it connects on Start. report
// receives the connection's state changes (nil: none) and must not block.
func NewSink(cfg Config, report connectors.StateFunc) (*Sink, error) {
	if err := cfg.validate(false); err != nil {
		return nil, err
	}
	log := cfg.logger()
	if report == nil {
		report = func(connectors.ConnState) {}
	}
	var markerOnly natsgo.Header
	if cfg.LoopMarker != "" {
		markerOnly = natsgo.Header{LoopHeader: {cfg.LoopMarker}}
	}
	return &Sink{
		markerOnly: markerOnly,
		cfg:        cfg,
		report:     report,
		log:        log,
		rlog:       connectors.NewRateLogger(log, 10*time.Second, nil),
		closed:     make(chan struct{}),
		tr:         newTracker(),
		kick:       make(chan struct{}, 1),
		stopping:   make(chan struct{}),
		abandon:    make(chan struct{}),
	}, nil
}

// Stats returns the Sink's counters. It may be called at any time.
func (s *Sink) Stats() SinkStats {
	return SinkStats{Confirmed: s.published.Load(), FlushRounds: s.rounds.Load(), ReconnectBufferFull: s.bufferFull.Load()}
}

// Start connects and returns once connected (and, for JetStream, once the
// stream is known to exist), or ctx ends.
func (s *Sink) Start(ctx context.Context) error {
	opts, err := s.cfg.options(s.report, s.log, s.tr, s.onAsyncError)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.nc != nil {
		s.mu.Unlock()
		return errors.New("nats: Sink started twice")
	}
	s.mu.Unlock()
	nc, err := connect(ctx, &s.cfg, s.tr, opts)
	if nc != nil {
		s.mu.Lock()
		s.nc = nc
		s.mu.Unlock()
		select {
		case <-s.closed:
			nc.Close()
			return connectors.ErrClosed
		default:
		}
	}
	if err != nil {
		return err
	}
	detail := "core NATS"
	if jcfg := s.cfg.JetStream; jcfg != nil {
		js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(s.cfg.flushTimeout()))
		if err != nil {
			return fmt.Errorf("nats: jetstream: %w", err)
		}
		sctx, cancel := context.WithTimeout(ctx, s.cfg.flushTimeout())
		_, err = js.Stream(sctx, jcfg.Stream)
		cancel()
		if err != nil {
			return jsFailure(fmt.Errorf("nats: jetstream stream %q: %w", jcfg.Stream, err))
		}
		s.mu.Lock()
		s.js = js
		s.mu.Unlock()
		detail = "JetStream stream " + jcfg.Stream
	} else {
		s.flusher.Add(1)
		go s.runFlusher(nc)
	}
	s.mu.Lock()
	s.running = true
	s.mu.Unlock()
	s.report(connectors.ConnState{Up: true, Reason: "Connected", Detail: detail})
	return nil
}

func (s *Sink) onAsyncError(_ *natsgo.Conn, _ *natsgo.Subscription, err error) {
	if m := publishDenied.FindStringSubmatch(err.Error()); m != nil && errors.Is(err, natsgo.ErrPermissionViolation) && s.cfg.JetStream == nil {
		s.denials.add(err, m[1])
		return // counted per message by the round it belongs to
	}
	s.rlog.Log(slog.LevelWarn, "async", "nats asynchronous error", slog.Any("err", err))
}

// publishDenied is how nats-server words a publish its permissions refuse.
var publishDenied = regexp.MustCompile(`Permissions Violation for Publish to "([^"]+)"`)

// denials are the publish refusals nats.go has handed to the asynchronous
// error handler, in the order the server sent them.
//
// The server answers a refused publish with -ERR and drops it, and nats.go
// reads that -ERR before the PONG of the round trip that follows the
// publish; but it hands the error to the handler on another goroutine, later.
// A round therefore compares nats.go's last error before and after its
// round trip: a new refusal means this round had one or more, and once the
// handler has seen that very error value, every refusal of the round is
// here.
type denials struct {
	mu      sync.Mutex
	list    []denial
	changed chan struct{} // closed and replaced on every add
}

type denial struct {
	err     error
	subject string
}

// maxDenials bounds the denials kept for rounds to take: refusals of a
// round whose round trip failed are never taken by it.
const maxDenials = 4096

func (d *denials) add(err error, subject string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.list) == maxDenials {
		d.list = slices.Delete(d.list, 0, maxDenials/2)
	}
	d.list = append(d.list, denial{err, subject})
	if d.changed != nil {
		close(d.changed)
		d.changed = nil
	}
}

// takeThrough waits, up to timeout, until last has been added, then removes
// and returns the subjects of every denial up to it. On timeout it returns
// what has arrived.
func (d *denials) takeThrough(last error, timeout time.Duration) map[string]bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		d.mu.Lock()
		i := slices.IndexFunc(d.list, func(x denial) bool { return x.err == last })
		if i >= 0 {
			subjects := make(map[string]bool, i+1)
			for _, x := range d.list[:i+1] {
				subjects[x.subject] = true
			}
			d.list = slices.Delete(d.list, 0, i+1)
			d.mu.Unlock()
			return subjects
		}
		if d.changed == nil {
			d.changed = make(chan struct{})
		}
		changed := d.changed
		d.mu.Unlock()
		select {
		case <-changed:
		case <-deadline.C:
			d.mu.Lock()
			subjects := make(map[string]bool, len(d.list))
			for _, x := range d.list {
				subjects[x.subject] = true
			}
			d.list = nil
			d.mu.Unlock()
			return subjects
		}
	}
}

// Write publishes m and waits for the server's confirmation.
func (s *Sink) Write(ctx context.Context, m *connectors.Message) error {
	nc, js, err := s.ready(m.Topic)
	if err != nil {
		return err
	}
	if js != nil {
		// Not the shared header: nats.go adds the expected-stream header
		// to the message's own map.
		if err := s.writeJetStream(ctx, nc, js, fromMessage(m, s.cfg.LoopMarker)); err != nil {
			return err
		}
		s.published.Add(1)
		return nil
	}
	r, i, err := s.join(ctx, s.coreMessage(m))
	if err != nil {
		return err
	}
	return s.outcome(nc, r, i)
}

// WriteAsync implements [connectors.AsyncWriter]. Core NATS: m joins the
// next round and done is called when the round's PONG confirms it, by the
// goroutine that runs the rounds. JetStream: done is called once the
// stream's PubAck (or its absence) is known.
func (s *Sink) WriteAsync(m *connectors.Message, done func(error)) {
	nc, js, err := s.ready(m.Topic)
	if err != nil {
		done(err)
		return
	}
	if js != nil {
		s.mu.Lock()
		select {
		case <-s.closed:
			s.mu.Unlock()
			done(connectors.ErrClosed)
			return
		default:
		}
		s.jsWrites.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.jsWrites.Done()
			// Close abandons the wait for the PubAck once its own ctx ends,
			// so that it can wait for this goroutine.
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() {
				select {
				case <-s.abandon:
					cancel()
				case <-ctx.Done():
				}
			}()
			err := s.writeJetStream(ctx, nc, js, fromMessage(m, s.cfg.LoopMarker))
			if err == nil {
				s.published.Add(1)
			} else if ctx.Err() != nil {
				err = connectors.ErrClosed
			}
			done(err)
		}()
		return
	}
	if !s.enqueue(s.coreMessage(m), done) {
		done(connectors.ErrClosed)
	}
}

// ready returns the connection to publish on, or why there is none.
func (s *Sink) ready(subject string) (*natsgo.Conn, jetstream.JetStream, error) {
	select {
	case <-s.closed:
		return nil, nil, connectors.ErrClosed
	default:
	}
	s.mu.Lock()
	nc, js, running := s.nc, s.js, s.running
	s.mu.Unlock()
	if !running {
		return nil, nil, fmt.Errorf("nats: publish %q: the Sink has not started: %w", subject, connectors.ErrNotConnected)
	}
	if !nc.IsConnected() {
		if nc.IsClosed() {
			return nil, nil, s.lost(subject)
		}
		return nil, nil, fmt.Errorf("nats: publish %q: %w", subject, connectors.ErrNotConnected)
	}
	return nc, js, nil
}

// outcome is what the Write of message i of the finished round r returns.
func (s *Sink) outcome(nc *natsgo.Conn, r *flushRound, i int) error {
	subject := r.msgs[i].Subject
	if err := r.errs[i]; err != nil {
		return s.publishErr(nc, subject, err)
	}
	if err := r.err; err != nil {
		if errors.Is(err, natsgo.ErrConnectionClosed) && !nc.IsClosed() || errors.Is(err, natsgo.ErrTimeout) && !nc.IsConnected() && !nc.IsClosed() {
			return fmt.Errorf("nats: publish %q: connection lost before the server confirmed it: %w", subject, connectors.ErrNotConnected)
		}
		if nc.IsClosed() {
			return s.lost(subject)
		}
		return fmt.Errorf("nats: publish %q: %w", subject, err)
	}
	if r.genAfter != r.genBefore {
		return fmt.Errorf("nats: publish %q: the connection was replaced before the server confirmed it: %w", subject, connectors.ErrNotConnected)
	}
	s.published.Add(1)
	return nil
}

func (s *Sink) publishErr(nc *natsgo.Conn, subject string, err error) error {
	var rj connectors.Rejected
	switch {
	case errors.As(err, &rj):
		return err
	case errors.Is(err, natsgo.ErrReconnectBufExceeded):
		n := s.bufferFull.Add(1)
		s.rlog.Log(slog.LevelWarn, ReasonReconnectBuffer, "the nats reconnect buffer is full; the message is held and published again once connected",
			slog.String("reason", ReasonReconnectBuffer), slog.Uint64("total", n))
		return fmt.Errorf("nats: publish %q: reconnect buffer full: %w", subject, connectors.ErrNotConnected)
	case errors.Is(err, natsgo.ErrMaxPayload):
		// nats.go checks the server's max_payload before sending.
		return &connectors.RejectedError{Reason: connectors.ReasonTooLarge,
			Err: fmt.Errorf("nats: publish %q: over the server's max_payload of %d bytes: %w", subject, nc.MaxPayload(), err)}
	case errors.Is(err, natsgo.ErrConnectionClosed):
		return s.lost(subject)
	case !nc.IsConnected() && !nc.IsClosed():
		return fmt.Errorf("nats: publish %q: %w: %w", subject, err, connectors.ErrNotConnected)
	}
	return fmt.Errorf("nats: publish %q: %w", subject, err)
}

// join adds msg to the round that has not started yet and waits until the
// round is done. It returns the round and msg's index in it. A Write whose
// ctx ends before its round started takes its message back.
func (s *Sink) join(ctx context.Context, msg *natsgo.Msg) (*flushRound, int, error) {
	s.fmu.Lock()
	if s.stopped {
		s.fmu.Unlock()
		return nil, 0, connectors.ErrClosed
	}
	r, i := s.add(msg, nil)
	s.fmu.Unlock()
	select {
	case <-r.done:
		return r, i, nil
	case <-ctx.Done():
		s.fmu.Lock()
		if s.next == r {
			r.msgs[i] = nil // not started: never published
		}
		s.fmu.Unlock()
		return nil, 0, ctx.Err()
	}
}

// enqueue adds msg to the round that has not started yet, with done to be
// called with its outcome. It reports false after Close.
func (s *Sink) enqueue(msg *natsgo.Msg, done func(error)) bool {
	s.fmu.Lock()
	defer s.fmu.Unlock()
	if s.stopped {
		return false
	}
	s.add(msg, done)
	return true
}

// add appends msg to the waiting round, starting one if none waits. The
// caller holds fmu.
func (s *Sink) add(msg *natsgo.Msg, done func(error)) (*flushRound, int) {
	r := s.next
	if r == nil {
		r = &flushRound{done: make(chan struct{})}
		s.next = r
		select {
		case s.kick <- struct{}{}:
		default: // the flusher is already due to look
		}
	}
	i := len(r.msgs)
	r.msgs = append(r.msgs, msg)
	r.dones = append(r.dones, done)
	return r, i
}

// runFlusher runs the rounds one after another: it takes the waiting round
// (later Writes start the next one), publishes its messages back to back,
// and confirms them all with one PING/PONG.
//
// A publish that sat in nats.go's write buffer when the connection broke is
// discarded, while a PING queued after the break is sent on the next
// connection and answered: only an unchanged reconnect count around the
// round proves that its PONG confirms its publishes.
func (s *Sink) runFlusher(nc *natsgo.Conn) {
	defer s.flusher.Done()
	for {
		stop := false
		select {
		case <-s.kick:
		case <-s.stopping:
			stop = true
		}
		s.fmu.Lock()
		r := s.next
		s.next = nil
		if stop {
			s.stopped = true
		}
		s.fmu.Unlock()
		if r != nil {
			r.genBefore = nc.Stats().Reconnects
			lastBefore := nc.LastError()
			r.errs = make([]error, len(r.msgs))
			for i, m := range r.msgs {
				if m != nil {
					r.errs[i] = nc.PublishMsg(m)
				}
			}
			r.err = nc.FlushTimeout(s.cfg.flushTimeout())
			r.genAfter = nc.Stats().Reconnects
			if last := nc.LastError(); r.err == nil && last != lastBefore && errors.Is(last, natsgo.ErrPermissionViolation) {
				s.markDenied(r, s.denials.takeThrough(last, s.cfg.flushTimeout()))
			}
			s.rounds.Add(1)
			close(r.done)
			for i, done := range r.dones {
				if done != nil {
					done(s.outcome(nc, r, i))
				}
			}
		}
		if stop {
			return
		}
	}
}

// markDenied fails the messages of r whose subjects the server refused.
func (s *Sink) markDenied(r *flushRound, subjects map[string]bool) {
	for i, m := range r.msgs {
		if m != nil && r.errs[i] == nil && subjects[m.Subject] {
			r.errs[i] = &connectors.RejectedError{Reason: connectors.ReasonPublishDenied,
				Err: fmt.Errorf("nats: publish %q: the server's permissions refuse it", m.Subject)}
		}
	}
}

func (s *Sink) writeJetStream(ctx context.Context, nc *natsgo.Conn, js jetstream.JetStream, msg *natsgo.Msg) error {
	f, err := js.PublishMsgAsync(msg, jetstream.WithExpectStream(s.cfg.JetStream.Stream))
	if err != nil {
		return s.publishErr(nc, msg.Subject, err)
	}
	select {
	case <-f.Ok():
		return nil
	case err := <-f.Err():
		if !nc.IsConnected() && !nc.IsClosed() {
			return fmt.Errorf("nats: publish %q: no PubAck before the connection broke (%v): %w", msg.Subject, err, connectors.ErrNotConnected)
		}
		if nc.IsClosed() {
			return s.lost(msg.Subject)
		}
		return fmt.Errorf("nats: jetstream publish %q: %w", msg.Subject, err)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// lost is the error of a publish on subject once nats.go has closed the
// connection: ErrClosed after Close, else a *connectors.Failure
// (CredentialsRefused or ConnectionLost) that ends the Sink.
func (s *Sink) lost(subject string) error {
	select {
	case <-s.closed:
		return connectors.ErrClosed
	default:
	}
	select {
	case <-s.tr.closed: // the handler has recorded the last error
	case <-time.After(s.cfg.flushTimeout()):
	}
	return s.tr.failure(fmt.Sprintf("publish %q", subject))
}

// Close confirms what was published (core: a last round trip; JetStream:
// the outstanding PubAcks) within ctx, disconnects and waits for the Sink's
// goroutines.
func (s *Sink) Close(ctx context.Context) error {
	var err error
	s.once.Do(func() {
		s.mu.Lock()
		close(s.closed) // under mu: no JetStream write starts after it
		s.mu.Unlock()
		close(s.stopping)
		s.flusher.Wait()
		s.mu.Lock()
		nc, js := s.nc, s.js
		s.mu.Unlock()
		if nc == nil {
			return
		}
		if js != nil {
			select {
			case <-js.PublishAsyncComplete():
			case <-ctx.Done():
			}
		}
		close(s.abandon)
		s.jsWrites.Wait()
		s.tr.closing.Store(true)
		nc.Close()
		select {
		case <-s.tr.closed:
		case <-ctx.Done():
			err = fmt.Errorf("nats: closing: %w", ctx.Err())
		}
	})
	return err
}
