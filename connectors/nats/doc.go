// Package nats is the NATS driver of the bridge runtime: a
// [connectors.Source] for inbound resources and a [connectors.Sink] for
// outbound ones, on nats.go (and its jetstream package). The runtime owns
// conversion (nats-tokens/v1), routing, counting and retries; this package
// owns only the connection to nats-server and the mapping of NATS headers.
//
// # Connection, failures and retries
//
// nats.go reconnects forever, waiting [Config.Backoff] between attempts,
// also when the very first attempt fails, and restores every subscription on
// each new connection by itself; this driver keeps that and retries nothing
// else itself. Each change of the connection (lost, reconnect attempt
// failed, reconnected, closed) is reported to the runtime's
// [connectors.StateFunc], which shows it in /status and in the
// weida_connector_up metric, with the reason of the failed attempt:
// CredentialsRefused, BrokerUnreachable, DNSFailure, TLSFailure or
// ConnectionLost. TLS ([Config.TLS]) and the server's
// authentication methods (user and password, token, NKey seed, or a .creds
// file) are supported; secrets reach this package already resolved.
//
// nats.go gives a connection up only when the server refuses its
// credentials twice in a row. Read and Write then return a
// [*connectors.Failure] (CredentialsRefused, or ConnectionLost), and the
// runtime builds a new Source or Sink after its own backoff. Start fails
// with a Failure too when the reason is known: CredentialsRefused; the last
// attempt's reason when ctx ends before a connection is up; StreamMissing
// when the JetStream stream does not exist; PermissionDenied or
// SubscribeFailed when the server refuses a subscription. None is
// permanent: an operator can fix each while the runtime keeps trying.
//
// # Two modes
//
// Core NATS (no JetStream in the resource) is at-most-once, and the
// resource declares the loss at-most-once:
//   - Inbound, each route filter is one subscription. A message the server
//     sent while the connector was disconnected, or that was in flight when
//     the connection broke, is gone. If the bridge reads more slowly than
//     messages arrive, nats.go queues up to [Config.PendingMessages] or
//     [Config.PendingBytes] per subscription and then drops (a "slow
//     consumer"): those drops are counted ([Source.Dropped],
//     [Config.OnDrop], reason [connectors.ReasonBrokerDropped]) and logged,
//     never silent.
//   - Outbound, Write returns once a PING/PONG round trip after the publish
//     proved that the server read it (concurrent writes share round trips).
//     While disconnected, Write fails with [connectors.ErrNotConnected] and
//     the runtime holds the message; a publish refused because nats.go's
//     reconnect buffer is full ([Config.ReconnectBufferBytes]) is counted
//     ([Sink.ReconnectBufferFull]) and held the same way. A subject nobody
//     subscribes to swallows the message: core NATS cannot tell.
//
// JetStream (the resource names a stream, and inbound a durable consumer):
//   - Inbound, the Source pulls from the durable consumer, creating it with
//     explicit acks and one filter subject per route (DeliverAll, so a new
//     consumer starts from the beginning of the stream) or binding the
//     existing one, whose filter subjects it sets to the routes'. Each
//     message is acknowledged only after every weida copy was queued, or
//     negatively acknowledged (delivered again at once) when the connector
//     stops before handing it off; one never settled is delivered again after
//     the consumer's ack wait. A restart of the connector or of the server
//     loses nothing the stream kept; a message may arrive twice. The stream
//     must exist: the connector never creates or changes streams. When the
//     consumer (or its stream) is deleted under a running Source, Read
//     returns ConsumerMissing (or StreamMissing) for good, and the next
//     Source the runtime starts creates the consumer again. Several
//     routes in one resource need nats-server 2.10 (several filter subjects
//     per consumer); on older servers give each route its own resource.
//   - Outbound, Write returns once the stream acknowledged the publish
//     (PubAck). The publish must land in the named stream: a subject that
//     another stream captures, or none, is refused by the server and, after
//     the runtime's retries, counted as publish-failed.
//
// # Scale-out
//
// Several replicas may run one inbound resource. In core mode set a queue
// group ([Config.QueueGroup], broker.nats.queueGroup): the server gives each
// message to one member of the group, so the replicas split the load, and a
// weida subscriber dials every replica's endpoint to see all messages.
// Without a queue group every replica receives, and bridges, every message.
// In JetStream mode replicas share the durable consumer, which splits the
// messages among them the same way. Outbound resources scale by running more
// of them: publishing needs no coordination.
//
// # Metadata and what is lost
//
// The payload is carried unchanged. Headers map as follows, in both
// directions: [ContentTypeHeader] ("Content-Type") to weida's content_type,
// [TraceparentHeader] and [TracestateHeader] to W3C trace context. A Source
// finds them in any spelling of the name (NATS headers are case-sensitive).
// A Sink adds [LoopHeader] with [Config.LoopMarker] to every message, and a
// Source with the same marker flags such a message as looped, so that the
// runtime does not bridge it back. Every other header and the reply subject
// are not carried (losses properties and reply-to), nor JetStream metadata
// (sequence numbers, timestamps). Ordering across routes is not kept, and
// weida itself may reorder (loss ordering).
package nats
