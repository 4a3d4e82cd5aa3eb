// Package weida is a weida v0 peer over QUIC (quic-go) for the Pub/Sub
// pattern: a [Listener] hosts publisher paths that weida subscribers dial,
// and [Dial] returns a [Subscriber] of a remote publisher path. The wire
// rules are those of weida's PROTOCOL.md; docs/WEIDA.md in this repository
// lists what is implemented, with the tests that prove it, and what is not.
//
// # Identity and trust
//
// A peer is its key: [Fingerprint] is "sha256:" and the hex SHA-256 of a
// certificate's SubjectPublicKeyInfo. A listener without certificate files
// generates a self-signed one at start and logs its fingerprint; a
// subscriber pins it in the URL, weida://sha256:<hex>@host:port/path, or
// trusts a CA file instead. A listener can admit only listed client
// fingerprints ([ListenConfig].ClientFingerprints) and clients whose
// certificate a client CA issued with a listed name
// ([ListenConfig].ClientIdentities, ClientCAFile); others fail the TLS
// handshake.
//
// # Delivery
//
// Publish writes one copy per matching subscriber connection, each on its
// own QUIC stream: best effort, with explicit drops when a subscriber's
// budget is full, no ordering between copies, no retention and no
// application acknowledgement. Nothing survives a connection: a subscriber
// that loses it dials and subscribes again.
//
// # Concurrency and lifetime
//
// Every exported method is safe for concurrent use. Listeners and
// subscribers start goroutines (per connection: stream handling, the HELLO
// timer, a fan-out writer) and Close waits until all of them have ended.
// Limits bound what a remote peer can make this side hold; see [Limits].
package weida
