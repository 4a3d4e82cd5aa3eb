// Package amqp is the AMQP 0-9-1 (RabbitMQ) driver of the bridge runtime: a
// [connectors.Source] that consumes a queue bound to a topic exchange for
// inbound resources, and a [connectors.Sink] that publishes to the exchange
// with publisher confirms for outbound ones. It uses amqp091-go. The runtime
// owns conversion (policy amqp-words/v1), routing, counting and retries; this
// package owns the broker connection, the queue and its bindings, and the
// mapping of AMQP metadata.
//
// # Failures and retries
//
// The driver retries nothing itself. amqp091-go does not reconnect by
// default, and its experimental Recovery option is left off (it replays the
// topology it recorded rather than what the resource declares, and reopens
// channels underneath the driver, which must know exactly when delivery
// tags become void). A Source or Sink is one attempt with one connection
// and one channel for its whole life; the runtime supervises it, and after
// a failure closes it and builds a fresh one after its own jittered
// backoff.
//
// Start connects (TCP, TLS when Config.TLS is set, AMQP handshake, bounded by
// Config.ConnectTimeout), opens the channel and declares what the resource
// owns: the exchange, as a durable topic exchange (amq.topic qualifies; a
// name that exists as another type is refused), or with
// Config.ExchangePassive only checks that it exists; for a Source the
// queue, one binding per route binding key, basic.qos and the consumer; for
// a Sink, confirm mode. One goroutine per connection drains every
// notification the library offers for as long as the library keeps it
// open (connection and channel close, consumer cancel, connection blocked,
// returns, confirms): amqp091 delivers them from its one reader goroutine,
// and a notification nobody reads stalls it.
//
// Errors carry a [connectors.Failure] reason, also reported through the
// [connectors.StateFunc] (and so /status and the up metric):
//
//   - CredentialsRefused: the broker refused the login (403 ACCESS_REFUSED);
//   - PermissionDenied: the user may not use the virtual host (530
//     NOT_ALLOWED), or the broker closed the channel with 403 later;
//   - DeclarationRefused: the broker refused a declaration, binding or
//     consumer (a queue or exchange that exists with other properties, a
//     passive one that does not exist, a missing name under the reserved
//     prefix amq., another connection's exclusive queue, no permission);
//     the fix is on the broker, and the runtime's next attempt picks it up;
//   - BrokerUnreachable, DNSFailure, TLSFailure: the connection could not
//     be made;
//   - ConnectionLost: after Start, the connection or the channel closed
//     (broker restart, network failure, missed heartbeats, a channel
//     error): Read returns it, and so do Writes, including those still
//     waiting for a confirm;
//   - ConsumerMissing: the broker cancelled the consumer (the queue was
//     deleted); Read returns it.
//
// None is permanent: each is something an operator can fix while the
// runtime keeps trying. A Sink whose broker blocks publishers
// (connection.blocked: a memory or disk alarm) reports Blocked, still
// connected, until the broker unblocks it; meanwhile Write returns an error
// wrapping [connectors.ErrNotConnected] and the runtime holds the message.
//
// # Inbound
//
// The Source consumes with manual acknowledgements. The runtime settles a
// message after every weida copy is queued (or after it dropped and counted
// the message on purpose): basic.ack; if it cannot (the connector is
// stopping), basic.nack with requeue, sent at once. Positive
// acknowledgements are coalesced into one basic.ack with the multiple flag
// per quarter of the prefetch window, at most a millisecond after a
// settlement (whether or not Read is waiting, so also for messages settled
// late, once their copies were received), and on Close, which spares
// RabbitMQ (and the connector) one acknowledgement per message. A message
// settled but not yet acknowledged when the connection breaks is delivered
// again. Config.Prefetch bounds the deliveries held unacknowledged, which
// is the backpressure between RabbitMQ and weida.
// Delivery tags are valid only on the channel that delivered them: once
// the channel is lost, settling one of its deliveries does nothing, since
// RabbitMQ has requeued it and will deliver it again (with the redelivered
// flag) to the next Source. Inbound delivery is therefore at least once towards the connector;
// weida itself delivers at most once to each subscriber.
//
// Which queue to consume is the resource's choice:
//
//   - A named durable queue (queue.name set, durable: true) survives
//     connector restarts and RabbitMQ restarts, and so do its bindings.
//     Messages that arrive while no connector consumes wait in it; a
//     restarted connector, or RabbitMQ coming back, loses nothing the queue
//     held. For this to include the messages RabbitMQ had not yet written
//     to disk, publishers must publish them persistent (delivery mode 2).
//   - A named non-durable queue survives connector restarts but not a
//     RabbitMQ restart.
//   - An exclusive queue, and in particular a server-named one (no
//     queue.name), belongs to one connection and is deleted with it. Every
//     new Source declares a new, empty queue: **whatever is published
//     while the connector is disconnected or restarting is lost**, and so
//     are the messages the old queue still held.
//
// The connector declares and binds only when a Source or Sink starts: an
// exchange or binding deleted behind its back is restored by the next
// attempt, not before (a deleted queue cancels the consumer, which ends the
// Source with ConsumerMissing).
//
// The queue's bindings are never removed by the connector: a durable queue
// keeps the bindings of routes deleted from the resource since, and the
// runtime drops what they bring in as no-route (counted). Unbind such keys
// with rabbitmqctl or the management UI.
//
// Scale-out: several connector replicas running the same resource consume
// the one named queue as competing consumers; RabbitMQ gives each message to
// one of them (round-robin within each consumer's prefetch window), and
// weida subscribers dial every replica's endpoint. Exclusive queues cannot be
// shared. Ordering across replicas is not kept (it is not kept across weida
// either: the ordering loss).
//
// # Outbound
//
// The Sink publishes each message to the exchange with the converted weida
// topic as routing key, persistent (delivery mode 2), with the mandatory flag,
// and waits for the publisher confirm. Every Write waits for its own confirm,
// so the runtime's bound on concurrent writes (spec.limits.inFlight) bounds the
// unconfirmed messages. A message no binding routes comes back (basic.return)
// before its confirm; Write then returns an [*UnroutableError], which the
// runtime counts as unroutable. While the broker has blocked publishing (a
// memory or disk alarm), Write returns an error wrapping
// [connectors.ErrNotConnected] and the runtime holds the message and tries
// again. A connection lost after a publish and before its confirm leaves the
// outcome unknown: Write returns ConnectionLost, and the runtime publishes
// the message again through the next Sink, so outbound delivery is at least
// once and a consumer may see a duplicate.
//
// amqp091-go writes every publish and every acknowledgement with its own
// system call. The driver's connections gather the client's writes instead
// and write out, in one call, whatever gathered while the previous write was
// under way; an idle connection still writes at once.
//
// # Metadata and losses
//
// Carried both ways: the payload, unchanged; content_type; W3C trace context
// in the headers "traceparent" and "tracestate". The Sink also writes the
// header [LoopHeader] (the connector's loop marker) and [SeqHeader] (its
// publish sequence number, to match returns with confirms).
//
// Not carried inbound, and declared by inbound resources as losses:
// priority, expiration (expiry), reply_to (reply-to), correlation_id,
// message_id, timestamp, type, user_id, app_id, content_encoding, the
// delivery mode and every other header (properties). A weida message has
// nothing else to lose outbound. Dropped and counted: the empty routing key,
// in both directions (empty-routing-key); inbound, routing keys that are not
// UTF-8 (non-utf8-names); outbound, weida topics longer than 255 bytes
// (topic-length). Ordering is not kept (ordering).
package amqp
