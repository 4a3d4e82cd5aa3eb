package mqtt

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"

	"weida.dev/connector/connectors"
)

const defaultTimeout = 10 * time.Second

// Sink publishes an outbound resource's messages to an MQTT 5 broker with
// the configured QoS. With QoS 1, Write returns once the broker's PUBACK
// arrived; with QoS 0, once the PUBLISH was written.
type Sink struct {
	cfg    Config
	report connectors.StateFunc
	log    *slog.Logger

	window atomic.Int32 // the broker's Receive Maximum, from the last CONNACK

	mu     sync.Mutex
	cm     *autopaho.ConnectionManager
	cancel context.CancelFunc
	once   sync.Once
}

var (
	_ connectors.Sink     = (*Sink)(nil)
	_ connectors.Windowed = (*Sink)(nil)
)

// Window implements [connectors.Windowed]: with QoS 1, the broker's Receive
// Maximum bounds the PUBLISHes awaiting a PUBACK (Mosquitto advertises 20),
// so more concurrent writers would only queue inside paho. QoS 0 has no
// window.
func (s *Sink) Window() int {
	if s.cfg.QoS == 0 {
		return 0
	}
	return int(s.window.Load())
}

// NewSink returns a Sink; it connects on Start. report receives
// the connection's state changes (nil: none) and must not block.
func NewSink(cfg Config, report connectors.StateFunc) (*Sink, error) {
	if report == nil {
		report = func(connectors.ConnState) {}
	}
	if _, err := cfg.clientConfig(report, logger(cfg.Logger), nil, nil); err != nil {
		return nil, err
	}
	return &Sink{cfg: cfg, report: report, log: logger(cfg.Logger)}, nil
}

// Start connects and returns once the first connection is up. When ctx
// ends first, the error is a [*connectors.Failure] with the reason the last
// attempt failed for, if one did.
func (s *Sink) Start(ctx context.Context) error {
	fails := newLastFailure()
	cc, err := s.cfg.clientConfig(s.report, s.log, nil, fails)
	if err != nil {
		return err
	}
	markUp := cc.OnConnectionUp
	cc.OnConnectionUp = func(cm *autopaho.ConnectionManager, ca *paho.Connack) {
		markUp(cm, ca)
		if s.cfg.refusedByConnack(ca) != nil {
			return // reported as lost: the runtime ends the attempt
		}
		window := int32(65535) // MQTT 5: an absent Receive Maximum means 65,535
		if ca != nil && ca.Properties != nil && ca.Properties.ReceiveMaximum != nil {
			window = int32(*ca.Properties.ReceiveMaximum)
		}
		s.window.Store(window)
		s.report(connectors.ConnState{Up: true, Reason: "Connected"})
	}
	runCtx, cancel := context.WithCancel(context.Background())
	cm, err := autopaho.NewConnection(runCtx, cc)
	if err != nil {
		cancel()
		return fmt.Errorf("mqtt: %w", err)
	}
	s.mu.Lock()
	s.cm, s.cancel = cm, cancel
	s.mu.Unlock()
	if err := cm.AwaitConnection(ctx); err != nil {
		return fails.startError(s.cfg.serverURL().String(), err)
	}
	return fails.refusal(ctx)
}

// Write publishes m. While the connection is down it fails at once with an
// error wrapping [connectors.ErrNotConnected]; the runtime waits and retries.
func (s *Sink) Write(ctx context.Context, m *connectors.Message) error {
	s.mu.Lock()
	cm := s.cm
	s.mu.Unlock()
	if cm == nil {
		return connectors.ErrClosed
	}
	props := &paho.PublishProperties{ContentType: m.ContentType}
	if m.Traceparent != "" {
		props.User.Add("traceparent", m.Traceparent)
	}
	if m.Tracestate != "" {
		props.User.Add("tracestate", m.Tracestate)
	}
	if s.cfg.LoopMarker != "" {
		props.User.Add(LoopProperty, s.cfg.LoopMarker)
	}
	p := &paho.Publish{QoS: s.cfg.QoS, Retain: s.cfg.Retain, Topic: m.Topic, Payload: m.Payload, Properties: props}
	resp, err := cm.Publish(ctx, p)
	// paho returns the PUBACK of a refusal with an error of its own; the
	// reason code says more.
	if resp != nil && resp.ReasonCode >= 0x80 {
		return pubackError(m.Topic, resp.ReasonCode)
	}
	if err != nil {
		if errors.Is(err, autopaho.ConnectionDownError) {
			return fmt.Errorf("mqtt: %w", connectors.ErrNotConnected)
		}
		return fmt.Errorf("mqtt: publish %q: %w", m.Topic, err)
	}
	return nil
}

// pubackError is the error for a PUBACK reason code of 0x80 or more (MQTT 5
// §3.4.2.1). The codes that say the broker will never take this message as
// it is are rejections, which the runtime counts at once; the others
// (0x80 unspecified, 0x83 implementation specific, 0x91 packet identifier
// in use, 0x97 quota exceeded) may pass when the message is sent again.
func pubackError(topic string, code byte) error {
	err := fmt.Errorf("mqtt: broker refused publish %q: reason code 0x%02x", topic, code)
	switch code {
	case 0x87: // Not authorized
		return &connectors.RejectedError{Reason: connectors.ReasonPublishDenied, Err: fmt.Errorf("%w (not authorized)", err)}
	case 0x95: // Packet too large
		return &connectors.RejectedError{Reason: connectors.ReasonTooLarge, Err: fmt.Errorf("%w (packet too large)", err)}
	case 0x90: // Topic Name invalid
		return &connectors.RejectedError{Reason: connectors.ReasonPublishFailed, Err: fmt.Errorf("%w (topic name invalid)", err)}
	case 0x99: // Payload format invalid
		return &connectors.RejectedError{Reason: connectors.ReasonPublishFailed, Err: fmt.Errorf("%w (payload format invalid)", err)}
	}
	return err
}

// Close disconnects and waits for the connection manager to stop.
func (s *Sink) Close(ctx context.Context) error {
	var err error
	s.once.Do(func() {
		s.mu.Lock()
		cm, cancel := s.cm, s.cancel
		s.cm = nil
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
	})
	return err
}
