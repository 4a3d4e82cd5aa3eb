package mqtt

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"

	"weida.dev/connector/connectors"
)

// Source reads an inbound resource's messages from an MQTT 5 broker.
//
// Acknowledgement after hand-off: paho acknowledges a QoS 1 PUBLISH when
// its receive callback returns, and the callback here returns only once the
// runtime has settled the message. PUBACKs therefore leave in the order the
// PUBLISHes arrived, as MQTT requires, and a message is acknowledged only
// after every weida copy has been queued. (paho's manual acknowledgement
// mode would batch PUBACKs on a 50 ms ticker, which caps a session at
// Receive Maximum messages per tick.) A message the runtime could not settle
// (the connector is stopping) must not be acknowledged: the callback then
// cuts the network connection before returning, so the PUBACK paho sends
// goes nowhere and the broker delivers the message again from the
// persistent session on the next connection.
type Source struct {
	cfg    Config
	report connectors.StateFunc
	log    *slog.Logger

	msgs   chan delivery
	closed chan struct{}

	refuseOnce sync.Once
	refusedCh  chan struct{} // closed when the broker refused the configuration
	refused    error         // a permanent *connectors.Failure, set before refusedCh closes

	mu      sync.Mutex
	conn    net.Conn // the current network connection
	cm      *autopaho.ConnectionManager
	started bool
	filters []string        // what Start subscribes, for Retire
	stale   []string        // filters a replaced Source subscribed in this session and this one does not
	runCtx  context.Context // ends when Close starts
	cancel  context.CancelFunc
	subs    sync.WaitGroup // OnConnectionUp's subscribe goroutines
	once    sync.Once

	// pipelined is set by Pipeline, before Start: PUBACKs are then
	// paho's manual acknowledgements, and onPublish does not wait.
	pipelined bool
}

// delivery is one PUBLISH handed to Read: settled through done, which
// onPublish waits on, or, pipelined, by ack alone.
type delivery struct {
	msg  *connectors.Message
	done chan error
	ack  connectors.AckFunc
}

// pipelinedAckInterval is how often paho sends the PUBACKs acknowledged
// so far when pipelined: short, since the broker's receive maximum (20 on
// Mosquitto) bounds what waits for them.
const pipelinedAckInterval = 5 * time.Millisecond

var (
	_ connectors.Source      = (*Source)(nil)
	_ connectors.Pipelining  = (*Source)(nil)
	_ connectors.Superseding = (*Source)(nil)
	_ connectors.Retiring    = (*Source)(nil)
)

// NewSource returns a Source; it connects on Start. report receives
// the connection's state changes (nil: none) and must not block.
func NewSource(cfg Config, report connectors.StateFunc) (*Source, error) {
	if report == nil {
		report = func(connectors.ConnState) {}
	}
	if _, err := cfg.clientConfig(report, logger(cfg.Logger), nil, nil); err != nil {
		return nil, err
	}
	return &Source{
		cfg:       cfg,
		report:    report,
		log:       logger(cfg.Logger),
		msgs:      make(chan delivery),
		closed:    make(chan struct{}),
		refusedCh: make(chan struct{}),
	}, nil
}

// subscription turns a route filter into what is sent to the broker.
func (s *Source) subscription(filter string) string {
	if s.cfg.SharedGroup != "" {
		return "$share/" + s.cfg.SharedGroup + "/" + filter
	}
	return filter
}

// Supersede implements [connectors.Superseding]. It must be called before
// Start. The previous filters this Source does not subscribe are withdrawn
// (UNSUBSCRIBE) on the first connection that resumes a session: the broker
// then holds the session the replaced Source used, with the same client ID.
// A replaced Source with another client ID left its session to expire by
// itself.
func (s *Source) Supersede(previous []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stale = slices.Clone(previous)
}

// Start connects and subscribes filters, then keeps re-subscribing on
// every reconnection (a broker that lost its session has lost them too).
//
// Start returns once the first connection is up, without waiting for the
// SUBACK: a resumed session may deliver held messages before it, and paho
// reads packets in order, so waiting here while nobody calls Read would
// deadlock. Whether the subscription took is reported through the
// StateFunc (Connected once the broker granted every filter,
// SubscribeFailed otherwise). When ctx ends first, the error is a
// [*connectors.Failure] with the reason the last attempt failed for, if
// one did.
func (s *Source) Start(ctx context.Context, filters []string) error {
	fails := newLastFailure()
	cc, err := s.cfg.clientConfig(s.report, s.log, s.setConn, fails)
	if err != nil {
		return err
	}
	// The subscribing goroutines read this copy, never s.filters, which
	// Retire reads under the lock.
	filters = slices.Clone(filters)
	s.mu.Lock()
	if s.started {
		s.mu.Unlock()
		return errors.New("mqtt: Start called twice; a Source serves one attempt")
	}
	s.started = true
	s.filters = filters
	s.stale = slices.DeleteFunc(s.stale, func(f string) bool { return slices.Contains(filters, f) })
	s.mu.Unlock()
	cc.EnableManualAcknowledgment = s.pipelined
	if s.pipelined {
		cc.SendAcksInterval = pipelinedAckInterval
	}
	cc.OnPublishReceived = []func(paho.PublishReceived) (bool, error){s.onPublish}
	runCtx, cancel := context.WithCancel(context.Background())
	s.mu.Lock()
	s.runCtx, s.cancel = runCtx, cancel
	s.mu.Unlock()
	markUp := cc.OnConnectionUp
	cc.OnConnectionUp = func(cm *autopaho.ConnectionManager, ca *paho.Connack) {
		markUp(cm, ca)
		if err := s.cfg.refusedByConnack(ca); err != nil {
			s.refuse(err)
			return
		}
		// Must not block: subscribe from a goroutine Close waits for.
		s.subs.Add(1)
		go func() {
			defer s.subs.Done()
			if err := s.subscribe(runCtx, cm, filters); err != nil {
				if runCtx.Err() == nil {
					s.report(connectors.ConnState{Reason: "SubscribeFailed", Detail: err.Error()})
					s.log.Error("mqtt subscribe failed", "err", err)
				}
				return
			}
			detail := fmt.Sprintf("%d subscriptions", len(filters))
			if ca.SessionPresent {
				detail += ", session resumed"
				s.withdrawStale(runCtx, cm)
			}
			s.report(connectors.ConnState{Up: true, Reason: "Connected", Detail: detail, Session: s.session(ca)})
		}()
	}
	cm, err := autopaho.NewConnection(runCtx, cc)
	if err != nil {
		cancel()
		return fmt.Errorf("mqtt: %w", err)
	}
	s.mu.Lock()
	s.cm = cm
	s.mu.Unlock()
	if err := cm.AwaitConnection(ctx); err != nil {
		return fails.startError(s.cfg.serverURL().String(), err)
	}
	return fails.refusal(ctx)
}

// session describes the broker session of a connection for the runtime,
// which tells a lost one from the first: only a persistent session (clean
// start false, a session expiry) is one the connector expects to resume.
func (s *Source) session(ca *paho.Connack) connectors.Session {
	if s.cfg.CleanStart || s.cfg.SessionExpiry <= 0 {
		return connectors.Session{}
	}
	return connectors.Session{
		Key:     s.cfg.serverURL().String() + " client ID " + s.cfg.ClientID,
		Resumed: ca.SessionPresent,
		Lost: fmt.Sprintf("the messages published to the resource's filters while it was disconnected (up to its sessionExpiry of %s), and any QoS 1 message delivered and not yet acknowledged",
			s.cfg.SessionExpiry),
	}
}

// refuse ends the attempt with err, a configuration the broker refused:
// Read returns it.
func (s *Source) refuse(err error) {
	s.refuseOnce.Do(func() {
		s.refused = err
		close(s.refusedCh)
	})
}

func (s *Source) subscribe(ctx context.Context, cm *autopaho.ConnectionManager, filters []string) error {
	sub := &paho.Subscribe{}
	for _, f := range filters {
		// Retain as published: a retained message published while
		// subscribed keeps its flag, so that a last-value cache sees a
		// new retained value, or its deletion, as such.
		sub.Subscriptions = append(sub.Subscriptions, paho.SubscribeOptions{Topic: s.subscription(f), QoS: s.cfg.QoS, RetainAsPublished: true})
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout())
	defer cancel()
	ack, err := cm.Subscribe(ctx, sub)
	if err != nil {
		return fmt.Errorf("mqtt: subscribe: %w", err)
	}
	for i, rc := range ack.Reasons {
		if rc >= 0x80 && i < len(filters) {
			return fmt.Errorf("mqtt: broker refused subscription %q: reason code 0x%02x", s.subscription(filters[i]), rc)
		}
	}
	return nil
}

// Retire implements [connectors.Retiring]: it unsubscribes every filter,
// so that the session the broker keeps after Close holds no subscription
// and collects no messages until it expires. It needs the connection up.
func (s *Source) Retire(ctx context.Context) error {
	s.mu.Lock()
	cm, filters := s.cm, s.filters
	s.mu.Unlock()
	if cm == nil || len(filters) == 0 {
		return nil
	}
	if err := s.unsubscribe(ctx, cm, filters); err != nil {
		return fmt.Errorf("mqtt: withdrawing the subscriptions of a removed resource: %w", err)
	}
	s.log.Info("mqtt: withdrew the subscriptions of a removed resource", "filters", filters)
	return nil
}

// withdrawStale unsubscribes the filters a replaced Source left in the
// resumed session. Until it succeeds, their messages are counted as
// no-route drops; it is tried again on the next resumed connection.
func (s *Source) withdrawStale(ctx context.Context, cm *autopaho.ConnectionManager) {
	s.mu.Lock()
	stale := s.stale
	s.mu.Unlock()
	if len(stale) == 0 {
		return
	}
	if err := s.unsubscribe(ctx, cm, stale); err != nil {
		if ctx.Err() == nil {
			s.log.Warn("mqtt: could not withdraw the subscriptions of removed routes; their messages are counted as no-route", "filters", stale, "err", err)
		}
		return
	}
	s.mu.Lock()
	s.stale = nil
	s.mu.Unlock()
	s.log.Info("mqtt: withdrew the subscriptions of routes a reload removed", "filters", stale)
}

// unsubscribe withdraws the broker's subscriptions to filters, waiting at
// most the connect timeout for the UNSUBACK.
func (s *Source) unsubscribe(ctx context.Context, cm *autopaho.ConnectionManager, filters []string) error {
	unsub := &paho.Unsubscribe{}
	for _, f := range filters {
		unsub.Topics = append(unsub.Topics, s.subscription(f))
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout())
	defer cancel()
	_, err := cm.Unsubscribe(ctx, unsub)
	return err
}

func (s *Source) timeout() time.Duration {
	if s.cfg.ConnectTimeout > 0 {
		return s.cfg.ConnectTimeout
	}
	return defaultTimeout
}

// onPublish hands one PUBLISH to Read and waits until the runtime settles
// it; returning lets paho send the PUBACK.
func (s *Source) onPublish(pr paho.PublishReceived) (bool, error) {
	p := pr.Packet
	m := &connectors.Message{
		Topic:    p.Topic,
		Payload:  p.Payload,
		Retained: p.Retain,
		// DUP: the broker sent this PUBLISH before, on this session's
		// earlier connection, and saw no PUBACK for it.
		Redelivered: p.Duplicate(),
	}
	if props := p.Properties; props != nil {
		if props.MessageExpiry != nil {
			// For a retained message the broker sends what is left of
			// its expiry interval; the value then ends for the cache too.
			m.ReceivedUnixNano = time.Now().UnixNano()
			m.ExpiresUnixNano = m.ReceivedUnixNano + int64(*props.MessageExpiry)*int64(time.Second)
		}
		m.ContentType = props.ContentType
		m.Traceparent = userProperty(props, "traceparent")
		m.Tracestate = userProperty(props, "tracestate")
		if s.cfg.LoopMarker != "" && userProperty(props, LoopProperty) == s.cfg.LoopMarker {
			m.Looped = true
		}
	}
	if s.pipelined {
		s.handOff(pr, m)
		return true, nil
	}
	d := delivery{msg: m, done: make(chan error, 1)}
	select {
	case s.msgs <- d:
	case <-s.closed:
		s.cutConnection()
		return true, nil
	}
	select {
	case err := <-d.done:
		if err != nil {
			s.cutConnection()
		}
	case <-s.closed:
		s.cutConnection()
	}
	return true, nil
}

// Pipeline implements [connectors.Pipelining]: the runtime settles
// messages later, out of order, while it reads on. PUBACKs become paho's
// manual acknowledgements, which paho sends in the order the PUBLISHes
// arrived, each once it and all before it are acknowledged (MQTT 5
// §4.6 asks for that order): one settled early waits for the ones before
// it. Call it before Start.
func (s *Source) Pipeline() { s.pipelined = true }

// handOff hands one PUBLISH to Read without waiting for its settlement.
// Its AckFunc acknowledges it to the client connection it arrived on (a
// later connection's client knows nothing of it, and the broker delivers
// it again there); an error cuts the connection, as when not pipelined,
// so that the broker delivers it, and whatever is unacknowledged after
// it, again.
func (s *Source) handOff(pr paho.PublishReceived, m *connectors.Message) {
	cli, pub := pr.Client, pr.Packet
	ack := func(err error) {
		if err != nil {
			s.cutConnection()
			return
		}
		if e := cli.Ack(pub); e != nil {
			s.log.Debug("mqtt: acknowledging a message failed; the broker delivers it again", "err", e)
		}
	}
	select {
	case s.msgs <- delivery{msg: m, ack: ack}:
	case <-s.closed:
		s.cutConnection()
	}
}

func (s *Source) setConn(c net.Conn) {
	s.mu.Lock()
	s.conn = c
	s.mu.Unlock()
}

// cutConnection closes the network connection under paho, so that the
// PUBACK for an unsettled message is never sent.
func (s *Source) cutConnection() {
	s.mu.Lock()
	c := s.conn
	s.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// Read returns the next message and the function that settles it.
func (s *Source) Read(ctx context.Context) (*connectors.Message, connectors.AckFunc, error) {
	select {
	case d := <-s.msgs:
		if d.ack != nil {
			return d.msg, d.ack, nil
		}
		return d.msg, func(err error) { d.done <- err }, nil
	case <-s.closed:
		return nil, nil, connectors.ErrClosed
	case <-s.refusedCh:
		return nil, nil, s.refused
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
}

// Close disconnects (the session stays on the broker for SessionExpiry) and
// waits for the connection manager to stop.
// Redelivers implements [connectors.Redelivering]: the broker delivers a
// message again, to the next connection of the session, exactly when it
// can be held (QoS 1 in a session that outlives the connection).
func (s *Source) Redelivers() bool {
	return hold(Options{QoS: s.cfg.QoS, CleanStart: s.cfg.CleanStart, SessionExpiry: s.cfg.SessionExpiry}).OK
}

func (s *Source) Close(ctx context.Context) error {
	var err error
	s.once.Do(func() {
		close(s.closed)
		s.mu.Lock()
		cm, cancel := s.cm, s.cancel
		s.mu.Unlock()
		if cm == nil {
			return
		}
		err = cm.Disconnect(ctx)
		cancel()
		select {
		case <-cm.Done():
		case <-ctx.Done():
			err = ctx.Err()
		}
		s.subs.Wait()
	})
	return err
}
