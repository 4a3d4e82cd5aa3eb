package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"weida.dev/connector/connectors"
)

// dropPollInterval is how often a core Source reads nats.go's per
// subscription drop counters. nats.go reports the start of a slow-consumer
// episode at once (its async error handler), but not each message dropped
// during one; the poll catches those.
const dropPollInterval = time.Second

// Source reads an inbound resource's messages from nats-server.
//
// Core NATS (Config.JetStream nil): each route filter is one subscription
// (a queue subscription when Config.QueueGroup is set). Core NATS is
// at-most-once: the AckFunc does nothing, and a message in flight when the
// connection breaks, or one that nats.go drops because the bridge reads too
// slowly (a slow consumer, beyond Config.PendingMessages or PendingBytes),
// is gone. The latter are counted (Dropped, Config.OnDrop) and logged.
//
// JetStream (Config.JetStream set): the Source pulls from the durable
// consumer Config.JetStream.Durable of the stream, creating it (explicit
// acks, one filter subject per route) when it does not exist, binding it
// when it does. The AckFunc acknowledges a message with a nil error and
// asks for redelivery (NAK) otherwise; a message never settled is
// delivered again after the consumer's ack wait. Nothing the stream kept
// is lost across restarts of the connector or the server; a message may
// arrive twice.
//
// Read must not be called from several goroutines at once; AckFuncs may be
// called from any goroutine.
type Source struct {
	cfg    Config
	report connectors.StateFunc
	log    *slog.Logger
	rlog   *connectors.RateLogger

	msgs     chan *connectors.Message // core deliveries
	closed   chan struct{}
	tr       *tracker
	stopPoll chan struct{}
	poll     sync.WaitGroup
	once     sync.Once

	mu      sync.Mutex
	started bool
	nc      *natsgo.Conn
	subs    []*coreSub
	js      jetstream.JetStream
	filters []string

	readMu sync.Mutex // serialises Read

	iterMu sync.Mutex // guards iter, which Close stops, and failed
	iter   jetstream.MessagesContext
	failed error // why the iterator ended for good; Read returns it from then on

	dropMu  sync.Mutex // guards coreSub.seen
	dropped atomic.Uint64

	maxAge atomic.Int64 // the bound stream's MaxAge (a time.Duration); 0: none
	msgTTL atomic.Bool  // the bound stream honours per-message TTLs (Nats-TTL)
}

type coreSub struct {
	filter string
	sub    *natsgo.Subscription
	seen   int // drops already counted
}

var _ connectors.Source = (*Source)(nil)

// NewSource checks cfg and returns a Source; it connects on Start. report
// receives the connection's state changes (nil: none) and must not block.
func NewSource(cfg Config, report connectors.StateFunc) (*Source, error) {
	if err := cfg.validate(true); err != nil {
		return nil, err
	}
	log := cfg.logger()
	if report == nil {
		report = func(connectors.ConnState) {}
	}
	return &Source{
		cfg:      cfg,
		report:   report,
		log:      log,
		rlog:     connectors.NewRateLogger(log, 10*time.Second, nil),
		msgs:     make(chan *connectors.Message, 128),
		closed:   make(chan struct{}),
		tr:       newTracker(),
		stopPoll: make(chan struct{}),
	}, nil
}

// Dropped returns how many messages nats.go discarded before the bridge
// could read them (slow consumer), over the Source's lifetime.
func (s *Source) Dropped() uint64 { return s.dropped.Load() }

// ReportDrops implements [connectors.DropReporter]: the runtime counts the
// slow-consumer drops per route. It must be called before Start; a
// Config.OnDrop set by the caller is still called too.
func (s *Source) ReportDrops(count func(filter, reason string, n int)) {
	prev := s.cfg.OnDrop
	s.cfg.OnDrop = func(filter, reason string, n int) {
		count(filter, reason, n)
		if prev != nil {
			prev(filter, reason, n)
		}
	}
}

// Start connects and subscribes filters (core) or binds the durable
// consumer (JetStream). It returns once the subscriptions are confirmed by
// the server, or ctx ends; nats.go keeps reconnecting afterwards and
// restores the subscriptions by itself. Its error is a
// [*connectors.Failure] when the reason is known: CredentialsRefused,
// BrokerUnreachable, DNSFailure, TLSFailure (the last reason an attempt
// failed for, when ctx ended first), PermissionDenied or SubscribeFailed
// (the server refused a subscription), StreamMissing, ConsumerMissing.
func (s *Source) Start(ctx context.Context, filters []string) error {
	s.mu.Lock()
	if s.started {
		s.mu.Unlock()
		return errors.New("nats: Source started twice")
	}
	s.started = true
	s.filters = slices.Clone(filters)
	s.mu.Unlock()
	if len(filters) == 0 {
		return errors.New("nats: no subject filter to subscribe")
	}
	opts, err := s.cfg.options(s.report, s.log, s.tr, s.onAsyncError)
	if err != nil {
		return err
	}
	nc, err := connect(ctx, &s.cfg, s.tr, opts)
	if nc != nil {
		s.mu.Lock()
		s.nc = nc
		s.mu.Unlock()
		select {
		case <-s.closed: // Close ran meanwhile and did not see nc
			nc.Close()
			return connectors.ErrClosed
		default:
		}
	}
	if err != nil {
		return err
	}
	var detail string
	if s.cfg.JetStream != nil {
		detail, err = s.startJetStream(ctx, nc, filters)
	} else {
		detail, err = s.startCore(ctx, nc, filters)
	}
	if err != nil {
		return err
	}
	s.report(connectors.ConnState{Up: true, Reason: "Connected", Detail: detail})
	return nil
}

func (s *Source) startCore(ctx context.Context, nc *natsgo.Conn, filters []string) (string, error) {
	pm, pb := s.cfg.pending()
	subs := make([]*coreSub, 0, len(filters))
	for _, f := range filters {
		var sub *natsgo.Subscription
		var err error
		if s.cfg.QueueGroup != "" {
			sub, err = nc.QueueSubscribe(f, s.cfg.QueueGroup, s.deliver)
		} else {
			sub, err = nc.Subscribe(f, s.deliver)
		}
		if err != nil {
			return "", fmt.Errorf("nats: subscribe %q: %w", f, err)
		}
		if err := sub.SetPendingLimits(pm, pb); err != nil {
			return "", fmt.Errorf("nats: subscribe %q: pending limits: %w", f, err)
		}
		subs = append(subs, &coreSub{filter: f, sub: sub})
	}
	s.mu.Lock()
	s.subs = subs
	s.mu.Unlock()
	// The server answers a subscription it refuses (a permissions
	// violation, an invalid subject) with -ERR, asynchronously: a round
	// trip makes sure it has read them all.
	fctx, cancel := context.WithTimeout(ctx, s.cfg.flushTimeout())
	defer cancel()
	if err := nc.FlushWithContext(fctx); err != nil {
		return "", fmt.Errorf("nats: confirming subscriptions: %w", err)
	}
	if err := nc.LastError(); err != nil {
		err = fmt.Errorf("nats: subscribing: %w", err)
		if errors.Is(err, natsgo.ErrPermissionViolation) {
			return "", connectors.Retryable(reasonPermission, err)
		}
		return "", connectors.Retryable(reasonSubscribe, err)
	}
	s.poll.Add(1)
	go s.pollDrops()
	detail := fmt.Sprintf("%d subscriptions", len(filters))
	if s.cfg.QueueGroup != "" {
		detail += " in queue group " + s.cfg.QueueGroup
	}
	return detail, nil
}

// deliver is nats.go's handler for core subscriptions. It runs on the
// subscription's own goroutine; while it waits for Read, nats.go queues
// further messages up to the pending limits.
func (s *Source) deliver(m *natsgo.Msg) {
	msg := toMessage(m.Subject, m.Data, m.Header, s.cfg.LoopMarker)
	select {
	case s.msgs <- msg:
	case <-s.closed:
	}
}

// onAsyncError is nats.go's asynchronous error handler.
func (s *Source) onAsyncError(_ *natsgo.Conn, sub *natsgo.Subscription, err error) {
	if errors.Is(err, natsgo.ErrSlowConsumer) {
		if !s.countDrops() && sub != nil {
			// Not a route subscription: JetStream's internal one, whose
			// messages the server delivers again after the ack wait.
			s.rlog.Log(slog.LevelWarn, "slow-consumer-internal", "nats dropped messages on an internal subscription; JetStream will deliver them again",
				slog.String("subject", sub.Subject))
		}
		return
	}
	s.rlog.Log(slog.LevelWarn, "async", "nats asynchronous error", slog.Any("err", err))
}

func (s *Source) pollDrops() {
	defer s.poll.Done()
	t := time.NewTicker(dropPollInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			s.countDrops()
		case <-s.stopPoll:
			return
		}
	}
}

// countDrops reads each subscription's drop counter and reports the
// increase. It returns whether it found any.
func (s *Source) countDrops() bool {
	s.mu.Lock()
	subs := s.subs
	s.mu.Unlock()
	found := false
	s.dropMu.Lock()
	defer s.dropMu.Unlock()
	for _, cs := range subs {
		n, err := cs.sub.Dropped()
		if err != nil || n <= cs.seen {
			continue
		}
		delta := n - cs.seen
		cs.seen = n
		found = true
		total := s.dropped.Add(uint64(delta))
		if s.cfg.OnDrop != nil {
			s.cfg.OnDrop(cs.filter, connectors.ReasonBrokerDropped, delta)
		}
		s.rlog.Log(slog.LevelWarn, "slow-consumer:"+cs.filter,
			"nats dropped messages before the bridge read them (slow consumer); they are lost",
			slog.String("filter", cs.filter), slog.String("reason", connectors.ReasonBrokerDropped),
			slog.Int("dropped", delta), slog.Uint64("dropped_total", total))
	}
	return found
}

// ---- JetStream ----

func (s *Source) startJetStream(ctx context.Context, nc *natsgo.Conn, filters []string) (string, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return "", fmt.Errorf("nats: jetstream: %w", err)
	}
	s.mu.Lock()
	s.js = js
	s.mu.Unlock()
	it, err := s.bind(ctx, js, filters)
	if err != nil {
		return "", err
	}
	s.setIter(it)
	return fmt.Sprintf("consumer %s on stream %s, %d filter subjects", s.cfg.JetStream.Durable, s.cfg.JetStream.Stream, len(filters)), nil
}

// bind creates or binds the durable consumer and starts pulling from it.
func (s *Source) bind(ctx context.Context, js jetstream.JetStream, filters []string) (jetstream.MessagesContext, error) {
	jcfg := s.cfg.JetStream
	ctx, cancel := context.WithTimeout(ctx, s.cfg.flushTimeout())
	defer cancel()
	stream, err := js.Stream(ctx, jcfg.Stream)
	if err != nil {
		return nil, jsFailure(fmt.Errorf("nats: jetstream stream %q: %w", jcfg.Stream, err))
	}
	s.noteStream(stream)
	cons, err := s.consumer(ctx, stream, filters)
	if err != nil {
		return nil, jsFailure(err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(s.cfg.pullMessages()))
	if err != nil {
		return nil, jsFailure(fmt.Errorf("nats: jetstream consumer %q: %w", jcfg.Durable, err))
	}
	return it, nil
}

// jsFailure classifies a JetStream error: the stream or the consumer is
// missing (deleted behind the connector's back), or the server refused the
// request for the connection's permissions. Other errors are left to the
// runtime.
func jsFailure(err error) error {
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return connectors.Retryable(reasonStream, err)
	case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrConsumerDeleted),
		errors.Is(err, jetstream.ErrConsumerDoesNotExist):
		return connectors.Retryable(reasonConsumer, err)
	case errors.Is(err, natsgo.ErrPermissionViolation):
		return connectors.Retryable(reasonPermission, err)
	}
	return err
}

// consumer returns the durable consumer, creating it when it does not
// exist. An existing consumer keeps the operator's settings, except that it
// must acknowledge explicitly and that its filter subjects are set to the
// routes' filters.
func (s *Source) consumer(ctx context.Context, stream jetstream.Stream, filters []string) (jetstream.Consumer, error) {
	jcfg := s.cfg.JetStream
	nc := s.conn()
	several := len(filters) > 1
	if several && !versionAtLeast(nc.ConnectedServerVersion(), 2, 10) {
		return nil, fmt.Errorf("nats: jetstream consumer %q: %d routes need a consumer with several filter subjects, which nats-server %s does not support (2.10 or later does); give each route its own resource and durable",
			jcfg.Durable, len(filters), nc.ConnectedServerVersion())
	}
	cons, err := stream.Consumer(ctx, jcfg.Durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		cc := jetstream.ConsumerConfig{
			Durable:       jcfg.Durable,
			Description:   "weida connector " + s.cfg.Name,
			AckPolicy:     jetstream.AckExplicitPolicy,
			DeliverPolicy: jetstream.DeliverAllPolicy,
			MaxAckPending: s.cfg.MaxAckPending,
		}
		setFilters(&cc, filters)
		cons, err = stream.CreateConsumer(ctx, cc)
		if err != nil {
			return nil, fmt.Errorf("nats: jetstream: creating durable consumer %q on stream %q: %w", jcfg.Durable, jcfg.Stream, err)
		}
		s.log.Info("created the durable JetStream consumer", "stream", jcfg.Stream, "durable", jcfg.Durable, "filters", filters)
		return cons, nil
	}
	if err != nil {
		return nil, fmt.Errorf("nats: jetstream: durable consumer %q on stream %q: %w", jcfg.Durable, jcfg.Stream, err)
	}
	info := cons.CachedInfo()
	if info.Config.AckPolicy != jetstream.AckExplicitPolicy {
		return nil, fmt.Errorf("nats: jetstream: durable consumer %q acknowledges with policy %s; the connector acknowledges each message after hand-off and needs explicit acks",
			jcfg.Durable, info.Config.AckPolicy)
	}
	if sameFilters(info.Config, filters) {
		return cons, nil
	}
	cc := info.Config
	setFilters(&cc, filters)
	cons, err = stream.UpdateConsumer(ctx, cc)
	if err != nil {
		return nil, fmt.Errorf("nats: jetstream: durable consumer %q filters %v differ from the routes %v and could not be updated: %w",
			jcfg.Durable, consumerFilters(info.Config), filters, err)
	}
	s.log.Info("set the durable JetStream consumer's filter subjects to the routes", "durable", jcfg.Durable,
		"was", consumerFilters(info.Config), "now", filters)
	return cons, nil
}

func setFilters(cc *jetstream.ConsumerConfig, filters []string) {
	if len(filters) == 1 {
		cc.FilterSubject, cc.FilterSubjects = filters[0], nil
	} else {
		cc.FilterSubject, cc.FilterSubjects = "", slices.Clone(filters)
	}
}

func consumerFilters(cc jetstream.ConsumerConfig) []string {
	if len(cc.FilterSubjects) > 0 {
		return cc.FilterSubjects
	}
	if cc.FilterSubject != "" {
		return []string{cc.FilterSubject}
	}
	return nil
}

func sameFilters(cc jetstream.ConsumerConfig, filters []string) bool {
	a, b := slices.Clone(consumerFilters(cc)), slices.Clone(filters)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// versionAtLeast reports whether a "major.minor.patch" server version is
// at least major.minor. An unparsable version is taken as new enough: the
// server then refuses what it cannot do, and nats.go reports it.
func versionAtLeast(v string, major, minor int) bool {
	parts := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	if len(parts) < 2 {
		return true
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return true
	}
	return ma > major || ma == major && mi >= minor
}

func (s *Source) conn() *natsgo.Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nc
}

func noAck(error) {}

// Read returns the next message and the function that settles it. Once
// nats.go has given up on the connection (the server refused the
// credentials twice; it retries anything else), Read returns, after the
// core messages already received, a [*connectors.Failure]
// (CredentialsRefused or ConnectionLost). In JetStream mode, once the
// consumer's iterator ends for good (the consumer or the stream was
// deleted), Read returns a Failure (ConsumerMissing, StreamMissing,
// ConnectionLost) from then on: a new Source creates the durable consumer
// again. After Close it returns [connectors.ErrClosed].
func (s *Source) Read(ctx context.Context) (*connectors.Message, connectors.AckFunc, error) {
	select {
	case <-s.closed:
		return nil, nil, connectors.ErrClosed
	default:
	}
	if s.cfg.JetStream != nil {
		return s.readJetStream(ctx)
	}
	select {
	case m := <-s.msgs:
		return m, noAck, nil
	case <-s.closed:
		return nil, nil, connectors.ErrClosed
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	case <-s.tr.closed:
		select {
		case m := <-s.msgs:
			return m, noAck, nil
		case <-s.closed:
			return nil, nil, connectors.ErrClosed
		default:
			return nil, nil, s.tr.failure("the connection closed")
		}
	}
}

func (s *Source) readJetStream(ctx context.Context) (*connectors.Message, connectors.AckFunc, error) {
	s.readMu.Lock()
	defer s.readMu.Unlock()
	it, failed := s.getIter()
	if failed != nil {
		return nil, nil, failed
	}
	if it == nil {
		return nil, nil, errors.New("nats: Read before a successful Start")
	}
	msg, err := it.Next(jetstream.NextContext(ctx))
	if err == nil {
		m := toMessage(msg.Subject(), msg.Data(), msg.Headers(), s.cfg.LoopMarker)
		m.Retained = true // the stream keeps it: a last-value cache in mode retained takes it
		if md := s.stored(m, msg); md != nil && md.NumDelivered > 1 {
			// The consumer delivered it before and saw no ack in its
			// ack wait.
			m.Redelivered = true
		}
		return m, s.acker(msg), nil
	}
	select {
	case <-s.closed:
		return nil, nil, connectors.ErrClosed
	default:
	}
	if ctx.Err() != nil {
		return nil, nil, ctx.Err()
	}
	// The iterator ended for good: the consumer or the stream was
	// deleted, or the connection closed.
	it.Stop()
	var f error
	switch {
	case s.tr.gone() || errors.Is(err, natsgo.ErrConnectionClosed):
		<-s.tr.closed
		f = s.tr.failure("the connection closed")
	default:
		f = jsFailure(fmt.Errorf("nats: jetstream consumer %q: %w", s.cfg.JetStream.Durable, err))
		if reasonOf(f) == "" {
			f = connectors.Retryable(reasonLost, f)
		}
	}
	s.setFailed(f)
	s.report(connectors.ConnState{Reason: reasonOf(f), Detail: f.Error()})
	s.log.Warn("the JetStream consumer stopped; the runtime starts a new Source", "durable", s.cfg.JetStream.Durable, "err", err)
	return nil, nil, f
}

func (s *Source) getIter() (jetstream.MessagesContext, error) {
	s.iterMu.Lock()
	defer s.iterMu.Unlock()
	return s.iter, s.failed
}

// setIter installs it, or stops it when the Source is closed meanwhile.
func (s *Source) setIter(it jetstream.MessagesContext) {
	s.iterMu.Lock()
	defer s.iterMu.Unlock()
	select {
	case <-s.closed:
		if it != nil {
			it.Stop()
		}
		s.iter = nil
	default:
		s.iter = it
	}
}

// setFailed records why the iterator ended; Read returns it from then on.
func (s *Source) setFailed(err error) {
	s.iterMu.Lock()
	defer s.iterMu.Unlock()
	s.iter, s.failed = nil, err
}

// nakDelay is how long the server waits before delivering a NAKed message
// again. The runtime NAKs only when the bridge stops mid-message; without a
// delay the server would hand the message straight back to this Source's
// outstanding pull, which is about to close, and it would come back only
// after the consumer's ack wait.
const nakDelay = time.Second

// acker settles one JetStream message: ACK after hand-off, NAK with
// [nakDelay] when the runtime could not hand it off. A failed ACK or NAK
// only means the server delivers the message again after its ack wait.
func (s *Source) acker(msg jetstream.Msg) connectors.AckFunc {
	return func(err error) {
		var aerr error
		if err == nil {
			aerr = msg.Ack()
		} else {
			aerr = msg.NakWithDelay(nakDelay)
		}
		if aerr != nil {
			s.rlog.Log(slog.LevelWarn, "ack", "settling a JetStream message failed; the server will deliver it again", slog.Any("err", aerr))
		}
	}
}

// Close disconnects and waits for the Source's goroutines. Core messages
// queued in nats.go and not yet read are lost (at-most-once); JetStream
// messages not yet acknowledged are delivered again by the server.
// Redelivers implements [connectors.Redelivering]: a JetStream durable
// consumer delivers again what was not acknowledged; core NATS never does.
func (s *Source) Redelivers() bool { return s.cfg.JetStream != nil }

func (s *Source) Close(ctx context.Context) error {
	var err error
	s.once.Do(func() {
		close(s.closed)
		s.mu.Lock()
		nc := s.nc
		started := s.started
		s.mu.Unlock()
		// Stopping the iterator ends a Read waiting inside Next.
		s.iterMu.Lock()
		if s.iter != nil {
			s.iter.Stop()
			s.iter = nil
		}
		s.iterMu.Unlock()
		if started {
			s.countDrops()
			close(s.stopPoll)
			s.poll.Wait()
		}
		if nc == nil {
			return
		}
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
