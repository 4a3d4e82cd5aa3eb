// Package wire is weida's v0 wire codec: the stream preamble every weida
// stream starts with, and the strict CBOR headers of the HELLO, DATA, ERROR,
// SUBSCRIBE and UNSUBSCRIBE frames.
//
// The rules are those of weida's docs/PROTOCOL.md (§3 framing, §4 kinds, §5
// header encoding, §6 headers, §8 golden vectors). The package uses only the
// standard library and performs no I/O beyond the [io.Reader] handed to
// [ReadPreamble].
//
// # Stream layout
//
// Every stream, and each half of a bidirectional stream separately, starts
// with
//
//	0x57 | kind (1 byte) | header_len (QUIC varint) | CBOR header (header_len bytes)
//
// followed, for DATA only, by opaque payload bytes until FIN. [ReadPreamble]
// reads the preamble and the header; [AppendPreamble] writes them.
//
// # Encoding
//
// The Append functions ([AppendHello], [AppendData], [AppendSubscribe],
// [AppendErrorFrame]) append one header to a caller's slice and return the
// extended slice, like [strconv.AppendInt]. They write one definite-length
// map, keys in ascending order, every integer in its shortest form, and
// leave absent optional keys out. They do not allocate when dst has room, and
// they never fail: they encode what they are given. A value that breaks a
// decoding rule (a topic over 256 bytes, a producer that is not 32 bytes)
// therefore produces a header that every conforming peer refuses; call the
// value's Validate method first when its fields come from outside.
//
// # Decoding
//
// The Decode functions accept exactly one header and apply every rule of
// PROTOCOL §5 and §6: one definite-length map and nothing after it, unsigned
// integer keys in strictly ascending order (which rejects duplicates, also
// among skipped keys, in constant space), unknown keys skipped by an
// iterative skipper that allows [MaxSkipDepth] nested containers,
// indefinite lengths, tags, half-precision floats and simple values other
// than false, true, null and undefined rejected anywhere, lists of at most
// [MaxListItems] items checked before any memory is reserved, a byte cap per
// text field, valid UTF-8 in every text string, the required keys of each
// frame, and the value rules of the keys the package knows.
//
// Every failure is an [*Error] whose Rule names the broken rule; a weida peer
// answers any of them by closing the connection with PROTOCOL_VIOLATION
// ([CodeProtocolViolation]).
//
// No decoder sizes memory from a length the peer declared beyond the bytes
// actually present: a string or list length is compared with the remaining
// input and with its cap before anything is sliced or reserved. A decoder
// allocates only what it returns: the text fields of one header share one
// string made from the header's bytes (so a retained field keeps at most one
// header, at most max_header_bytes, alive), and each non-empty list or map
// of a HELLO is one allocation.
//
// # Concurrency
//
// Every function is safe for concurrent use as long as callers do not share
// the slices they pass. No function keeps a slice it is given after it
// returns. Decoded values own fresh memory; the Append functions return dst,
// possibly grown; [ParsePreamble] returns a subslice of its input and
// [ReadPreamble] a slice of the buffer it was handed when that buffer was
// large enough.
package wire
