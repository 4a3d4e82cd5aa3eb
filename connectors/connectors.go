// Package connectors is the bridge runtime shared by every broker protocol.
//
// A [Bridge] runs one Connector resource: it owns topic conversion, the
// exactness guard, bounded queues, acknowledgements, retries, metrics and
// status conditions. A broker driver (connectors/mqtt, /nats, /amqp) owns
// only the broker: it implements [Source] for inbound resources and [Sink]
// for outbound ones, and maps the broker's metadata onto [Message].
//
// The split follows gocloud.dev/pubsub: what is the same for every broker
// is written once here, so that a driver cannot forget to count a drop or to
// acknowledge only after hand-off.
//
// # Supervision
//
// A [Runtime] runs every resource as a supervised unit: one attempt builds
// a fresh Source or Sink from the resource's factory, starts it and bridges
// until the attempt ends; after a failed attempt the runtime waits a
// jittered [Backoff] and makes another, until the unit is removed. A driver
// ends an attempt by returning a [*Failure] (see [Retryable] and
// [Permanent]) from Start, Read, Write or WriteAsync's done, or by
// returning [ErrClosed] from Read, Write or done when the runtime did not
// close it. Any other error from Start ends the attempt too, classified by
// [Classify]. Other errors from Read are logged and reading goes on; other
// errors from Write are handled per message (held while [ErrNotConnected],
// retried a few times, or dropped and counted). Only a permanent Failure,
// a configuration problem no retry can cure, stops the retries.
//
// Stability has one rule, [StableAfter], kept by a [Streak]: the runtime
// paces attempts with it, and a driver whose client library reconnects
// within an attempt paces those reconnections with its own Streak, telling
// it when the connection comes up and goes down, rather than with a rule
// of its own.
//
// A driver opts into more with optional interfaces, which the runtime
// checks for: [AsyncWriter] (confirm many writes at once), [Windowed] (the
// broker's own bound on unacknowledged publishes), [DropReporter] (losses
// inside the client library), [Superseding] and [Retiring] (subscriptions
// a broker session keeps across a reload), and, on errors, [Unroutable]
// and [Rejected] (outcomes that retrying cannot change).
package connectors

import (
	"context"
	"errors"
)

// Message is one message crossing a bridge.
//
// For an inbound bridge a Source fills Topic with the broker's topic name;
// for an outbound bridge the runtime fills it with the converted foreign
// topic before handing the message to a Sink. Payload bytes are never
// changed on the way.
type Message struct {
	Topic       string
	Payload     []byte
	ContentType string
	// Traceparent and Tracestate carry W3C trace context unchanged. Empty
	// means absent.
	Traceparent string
	Tracestate  string
	// Looped is set by a Source when the message carries this connector's
	// loop marker: a bridge of ours published it, so bridging it again
	// would echo it forever.
	Looped bool
	// Retained is set by a Source when the broker keeps the message as
	// its topic's current value for later subscribers: an MQTT retained
	// message (an empty payload then means the broker deleted the value),
	// or a message of a JetStream stream. A resource keeping a last-value
	// cache in mode retained caches exactly these (see [LastValue]).
	Retained bool
	// Sequence is the message's position in its source, where the source
	// numbers what it keeps: the JetStream stream sequence. 0 means the
	// source has none (MQTT, AMQP, core NATS). It goes to weida as the
	// copies' source sequence (DATA key 68), replayed or live.
	Sequence uint64
	// Redelivered is set by a Source when the broker says it may have
	// delivered this message before: MQTT's DUP flag, AMQP's redelivered
	// flag, a JetStream delivery count above one. An earlier delivery may
	// have been bridged (a connector killed after the copies went out and
	// before its acknowledgement reached the broker), so a drop of this
	// one is counted under [ReasonRedeliveryDropped], not as a loss.
	Redelivered bool
	// ReceivedUnixNano is when the message entered the connector (set by
	// the runtime when zero); it measures end-to-end latency.
	ReceivedUnixNano int64
	// SourceUnixNano is when the broker took the message, where the
	// broker says (a JetStream message's stream timestamp); 0 when it
	// does not. A last-value cache reports a replayed value's age from
	// it, else from ReceivedUnixNano.
	SourceUnixNano int64
	// ExpiresUnixNano is when the broker stops keeping the message for
	// later subscribers (MQTT Message Expiry Interval, JetStream MaxAge or
	// per-message TTL), as an absolute time; 0 when it does not expire.
	// A last-value cache ends the value then.
	ExpiresUnixNano int64
}

// AckFunc settles a message a Source returned. A nil error acknowledges it:
// every weida copy has been queued, or the message was dropped on purpose and
// counted. A non-nil error asks the broker to deliver it again where the
// protocol allows (AMQP nack with requeue); drivers that cannot redeliver
// leave the message unacknowledged so the broker's own redelivery applies.
// An AckFunc is called exactly once and must not block for long.
type AckFunc func(err error)

// Source reads messages from a foreign broker for an inbound bridge.
//
// The driver owns its connection: it connects, reconnects with backoff and
// re-subscribes by itself after Start, reporting its state through the
// [StateFunc] it was built with. When it cannot recover (the stream it
// consumes is gone, its credentials are refused), it ends the attempt:
// Read returns a [*Failure], and the runtime closes the Source and builds
// a new one after a backoff. Read and the AckFuncs it returns may be called
// from different goroutines. A Source serves one attempt: it is not
// started again after Close.
type Source interface {
	// Start connects and subscribes the broker filters (already validated
	// by the policy). It returns once the first connection is up, or ctx
	// ends; ctx bounds only this first attempt. An error ends the
	// runtime's attempt; return a [*Failure] to name its reason, and mark
	// it Permanent only when no retry can help. It may return before the
	// broker has granted the subscriptions (a resumed session can deliver
	// held messages first, and they must be readable); the driver reports
	// Up through its StateFunc once they are granted.
	Start(ctx context.Context, filters []string) error
	// Read returns the next message. It blocks until one arrives, ctx
	// ends, or the Source is closed ([ErrClosed]). A [*Failure], or
	// ErrClosed before Close, ends the attempt.
	Read(ctx context.Context) (*Message, AckFunc, error)
	// Close disconnects and waits for every goroutine of the Source.
	// Messages read but not acknowledged are left to the broker's
	// redelivery. Close may be called more than once.
	Close(ctx context.Context) error
}

// Sink publishes messages to a foreign broker for an outbound bridge.
//
// Like a [Source], a Sink serves one attempt of its unit. It ends the
// attempt by returning a [*Failure] (or [ErrClosed] before Close) from
// Start, Write or WriteAsync's done; the runtime then counts the writes
// still under way under [ReasonConnectionLost], closes the Sink and builds
// a new one after a backoff.
type Sink interface {
	// Start connects; it returns once connected or ctx ends. An error ends
	// the attempt, as for [Source].Start.
	Start(ctx context.Context) error
	// Write publishes m and returns once the broker has accepted it to the
	// degree the resource asks for (MQTT PUBACK, AMQP confirm, NATS flush
	// or JetStream ack). It may be called from several goroutines at once:
	// the runtime bounds how many. m.Topic is in the broker's grammar.
	Write(ctx context.Context, m *Message) error
	// Close flushes what it can within ctx, disconnects and waits for
	// every goroutine. Close may be called more than once.
	Close(ctx context.Context) error
}

// AsyncWriter is implemented by a Sink that can confirm many messages with
// one exchange with the broker (NATS core: one PING/PONG for every publish
// before it). The runtime then hands it messages from its receive loop and
// is told of each outcome, instead of keeping a goroutine parked in Write
// for every message in flight.
type AsyncWriter interface {
	// WriteAsync starts publishing m and returns without waiting for the
	// broker. done is called exactly once, from any goroutine (possibly
	// before WriteAsync returns), with the error Write would have
	// returned; it must not block. After Close, done gets [ErrClosed].
	WriteAsync(m *Message, done func(error))
}

// Windowed is implemented by a Sink whose broker bounds the publishes it
// holds unacknowledged per connection (MQTT's Receive Maximum). The runtime
// then runs no more concurrent writers than Window: writers beyond it would
// only wait inside the client library, and waking them costs CPU. Window is
// called after Start; zero means no bound.
type Windowed interface{ Window() int }

// Unroutable is implemented by errors a Sink returns when the broker took a
// message but had nowhere to route it (AMQP mandatory return). The runtime
// counts them instead of retrying. (An MQTT PUBACK "no matching
// subscribers" is a success: the broker may have retained the message.)
type Unroutable interface{ Unroutable() bool }

// Rejected is implemented by errors a Sink returns when the broker refused
// a message for good: it is larger than the broker takes, or the connector
// may not publish on its topic. Writing it again would fail the same way,
// so the runtime drops it at once and counts it under RejectReason
// ([ReasonTooLarge], [ReasonPublishDenied] or [ReasonPublishFailed]).
type Rejected interface{ RejectReason() string }

// RejectedError is an error that implements [Rejected].
type RejectedError struct {
	Reason string
	Err    error
}

func (e *RejectedError) Error() string        { return e.Err.Error() }
func (e *RejectedError) Unwrap() error        { return e.Err }
func (e *RejectedError) RejectReason() string { return e.Reason }

// Superseding is implemented by a Source whose broker keeps subscriptions in
// a session that outlives the connection (MQTT with a session expiry). When
// a reload replaces a resource, the runtime calls Supersede before Start
// with the broker filters the replaced Source subscribed. Once connected to
// the session they were kept in, the Source withdraws those it does not
// subscribe itself, so that a route the reload removed stops delivering
// instead of filling the no-route count until the session expires.
type Superseding interface{ Supersede(previous []string) }

// Retiring is implemented by a Source whose broker keeps its subscriptions
// after it disconnects (an MQTT session with an expiry). When a reload
// removes the resource, the runtime calls Retire before Close, and the
// Source withdraws its subscriptions, so that the broker stops keeping
// messages for a bridge that no longer exists.
type Retiring interface {
	Retire(ctx context.Context) error
}

// Redelivering is implemented by a Source whose broker delivers again, to
// the next consumer of the same subscription, a message the bridge settles
// with an error or never settles: MQTT QoS 1 in a session that outlives
// the connection, a JetStream durable consumer, a named AMQP queue. A
// fenced inbound bridge (see [Unit].Fence) leaves such a message with the
// broker, for the replica that now holds the resource; without the
// interface, or when Redelivers is false, it counts it as dropped under
// [ReasonFenced]. Redelivers is called once per attempt, after the
// factory built the Source.
type Redelivering interface{ Redelivers() bool }

// Pipelining is implemented by a Source whose Read waits for the previous
// message to be settled unless told otherwise (an MQTT client that sends
// each PUBACK when its handler returns). The runtime calls Pipeline once,
// before Start, when it will settle messages later and out of order (spec
// AwaitReceipt): from then on Read must go on while AckFuncs are pending,
// and the Source must keep whatever order its protocol needs for the
// acknowledgements themselves. Sources whose AckFuncs already act alone
// (JetStream, AMQP) need not implement it.
type Pipelining interface{ Pipeline() }

// DropReporter is implemented by a Source whose client library discards
// messages before Read could return them (the NATS slow-consumer
// condition). The runtime calls ReportDrops once, before Start, with a
// function that counts n drops for the route whose foreign filter is filter,
// under reason, in messages_dropped_total and /status. The function must
// not block and may be called from any goroutine.
type DropReporter interface {
	ReportDrops(count func(filter, reason string, n int))
}

// ErrClosed is returned by Read and Write after Close.
var ErrClosed = errors.New("connectors: closed")

// ConnState is the state of one side of a bridge.
type ConnState struct {
	Up     bool
	Reason string // CamelCase, Kubernetes style: Connected, Connecting, Refused...
	Detail string // a sentence for an operator; never a secret
	// Lost is set when the connection is gone for good and the driver
	// will not restore it (its client library does not reconnect, or gave
	// up). The runtime then ends the attempt with it at once, even when no
	// Read or Write would have noticed: an idle outbound Sink would
	// otherwise wait for the next message to find out. A [*Failure] keeps
	// its reason; other errors are classified.
	Lost error
	// Session, on an Up report of a driver whose broker keeps a session
	// for the connector across connections (an MQTT persistent session),
	// says which session this connection was meant to resume and whether
	// the broker still had it. The zero value: no such session.
	Session Session
}

// Session is the broker-side session of a connection, as an Up
// [ConnState] reports it. The runtime decides what a session not resumed
// means: none was expected on the first connection of a resource (in this
// process, or after a reload gave it another Key); on any later one, what
// the broker held for the connector while it was away is gone, and the
// runtime warns, says so in the BrokerConnected condition and counts it
// (weida_connector_sessions_lost_total).
type Session struct {
	// Key names the session, e.g. the broker address and the client ID;
	// empty means the connection keeps no session.
	Key string
	// Resumed is true when the broker still held the session (MQTT's
	// CONNACK session present).
	Resumed bool
	// Lost says what a session not resumed may have lost, for the
	// condition and the log; empty means a generic sentence.
	Lost string
}

// StateFunc receives a driver's connection state changes. It must not block.
type StateFunc func(ConnState)
