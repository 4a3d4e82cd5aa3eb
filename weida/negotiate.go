package weida

import (
	"fmt"
	"slices"

	"weida.dev/connector/weida/wire"
)

// agreed is the outcome of a successful negotiation (PROTOCOL §2.3 step 7).
type agreed struct {
	version uint64
	// sendMaxHeaderBytes is the peer's max_header_bytes: it caps the headers
	// this side sends. Our own receive cap is unaffected.
	sendMaxHeaderBytes uint64
	datagrams          bool
	// peerMaxTransfers is the peer's HELLO max_transfers (advisory): the
	// streams it says it allows at once, which bounds the copies it can
	// hold unread (see writtenLog.finish).
	peerMaxTransfers uint64
	// peerExtensions are the extension keys of the peer's HELLO, which
	// negotiation ignores (PROTOCOL §5) and the application may read.
	peerExtensions []wire.Extension
}

// localHello is the HELLO a v0 peer of this package sends: version 0, its
// receive cap, no capabilities, the core guarantee set (keys 5 and 6 absent).
func localHello(l *Limits) wire.Hello {
	return wire.NewHello(l.MaxHeaderBytes, uint64(l.MaxConcurrentUniStreams+l.MaxConcurrentBidiStreams))
}

// negotiationError is a failed negotiation; the connection is then closed
// with NEGOTIATION_FAILED.
type negotiationError struct{ why string }

func (e *negotiationError) Error() string { return "weida: negotiation failed: " + e.why }

// dimensions of a guarantee set this package reasons about, and how.
var (
	// ladders are ordered dimensions: the weaker level is the smaller value.
	ladders = [...]uint64{wire.GuaranteeDelivery, wire.GuaranteeAcknowledgement,
		wire.GuaranteeOrdering, wire.GuaranteeDeduplication, wire.GuaranteeControlIsolated}
	// unordered dimensions have no weaker level: both sides must state the
	// same one.
	unordered = [...]uint64{wire.GuaranteeBackpressure, wire.GuaranteeProducerNaming}
)

// coreLevel is the level an absent dimension means (PROTOCOL §6.5).
func coreLevel(dim uint64) (uint64, bool) {
	switch dim {
	case wire.GuaranteeAcknowledgement:
		return 1, true // TransportReceipt
	case wire.GuaranteeDelivery, wire.GuaranteeOrdering, wire.GuaranteeDeduplication,
		wire.GuaranteeControlIsolated, wire.GuaranteeBackpressure, wire.GuaranteeProducerNaming:
		return 0, true
	}
	return 0, false // durability, replicas, dedup_window_ms qualify another level
}

func level(set map[uint64]uint64, dim uint64) (uint64, bool) {
	if v, ok := set[dim]; ok {
		return v, true
	}
	return coreLevel(dim)
}

// negotiate is PROTOCOL §2.3: a pure function of our HELLO and the peer's.
// The peer's HELLO has passed wire.DecodeHello, so its guarantee sets hold
// only defined levels and legal combinations.
//
// Its branches are §2.3's steps, in the spec's order.
func negotiate(ours, theirs *wire.Hello) (agreed, error) {
	// Steps 1-3: the highest common version.
	var version uint64
	found := false
	for _, v := range theirs.Versions {
		if slices.Contains(ours.Versions, v) && (!found || v > version) {
			version, found = v, true
		}
	}
	if !found {
		return agreed{}, &negotiationError{fmt.Sprintf("no common version (ours %v, theirs %v)", ours.Versions, theirs.Versions)}
	}
	// Step 4: every capability the peer requires must be one we support.
	for _, c := range theirs.RequiredCapabilities {
		if !slices.Contains(ours.Capabilities, c) {
			return agreed{}, &negotiationError{fmt.Sprintf("peer requires capability %d", c)}
		}
	}
	// Step 5: the effective set, dimension by dimension the weaker offer.
	effective := make(map[uint64]uint64, len(ladders)+len(unordered))
	for _, d := range ladders {
		a, _ := level(ours.GuaranteesOffered, d)
		b, _ := level(theirs.GuaranteesOffered, d)
		effective[d] = min(a, b)
	}
	for _, d := range unordered {
		a, _ := level(ours.GuaranteesOffered, d)
		b, _ := level(theirs.GuaranteesOffered, d)
		if a != b {
			return agreed{}, &negotiationError{fmt.Sprintf("guarantee dimension %d offered as %d and %d, which cannot be intersected", d, a, b)}
		}
		effective[d] = a
	}
	// The qualifying axes survive only when both sides state the same one
	// under a level that keeps them; a core-only peer (ours) never offers
	// them, so they drop out of the effective set.
	for _, d := range [...]uint64{wire.GuaranteeDurability, wire.GuaranteeReplicas, wire.GuaranteeDedupWindowMs} {
		a, aok := ours.GuaranteesOffered[d]
		b, bok := theirs.GuaranteesOffered[d]
		if aok && bok && a == b {
			effective[d] = a
		}
	}
	// Step 6: the effective set must reach what the peer requires, on every
	// dimension; there is no downgrade.
	for d, want := range theirs.GuaranteesRequired {
		got, ok := effective[d]
		isLadder := slices.Contains(ladders[:], d)
		switch {
		case !ok:
			return agreed{}, &negotiationError{fmt.Sprintf("peer requires guarantee dimension %d = %d, which is not offered", d, want)}
		case isLadder && got < want, !isLadder && got != want:
			return agreed{}, &negotiationError{fmt.Sprintf("peer requires guarantee dimension %d = %d, effective is %d", d, want, got)}
		}
	}
	return agreed{
		version:            version,
		sendMaxHeaderBytes: theirs.MaxHeaderBytes,
		peerMaxTransfers:   theirs.MaxTransfers,
		peerExtensions:     theirs.Extensions,
		datagrams:          slices.Contains(ours.Capabilities, 1) && slices.Contains(theirs.Capabilities, 1),
	}, nil
}
