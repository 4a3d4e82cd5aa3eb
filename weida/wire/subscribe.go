package wire

// SUBSCRIBE and UNSUBSCRIBE keys.
const (
	subEndpoint = iota
	subFilter
	subMaxAgeMs
	subMaxLayer
)

// Subscribe is the header of SUBSCRIBE (kind 3) and UNSUBSCRIBE (kind 4),
// which differ only in the kind byte (PROTOCOL §6.4). Keys 0 and 1 are
// required; the empty filter is a real filter (every topic) and is always
// written.
//
// The filter's grammar is not checked here: a peer validates it (package
// weida/topic) and closes the connection with PROTOCOL_VIOLATION when it is
// illegal.
//
// MaxAgeMs and MaxLayer are written when their Has flag is set or they are
// not zero; a decoded Subscribe has the flags set exactly for the keys that
// were present.
type Subscribe struct {
	Endpoint    string // key 0, at most MaxEndpointBytes
	Filter      string // key 1, at most MaxFilterBytes
	MaxAgeMs    uint64 // key 2, radio only
	HasMaxAgeMs bool
	MaxLayer    uint64 // key 3, radio only, at most MaxLayer
	HasMaxLayer bool
}

// AppendSubscribe appends s's CBOR header (not the preamble) to dst and
// returns the extended slice; the same bytes serve SUBSCRIBE and UNSUBSCRIBE.
// It does not allocate when dst has room.
func AppendSubscribe(dst []byte, s *Subscribe) []byte {
	return appendSubscribe(dst, s, 0)
}

// appendSubscribe writes s's keys into a map head that counts extra more
// entries, which the caller appends after them.
func appendSubscribe(dst []byte, s *Subscribe, extra uint64) []byte {
	maxAge := s.HasMaxAgeMs || s.MaxAgeMs != 0
	maxLayer := s.HasMaxLayer || s.MaxLayer != 0
	n := 2 + extra
	if maxAge {
		n++
	}
	if maxLayer {
		n++
	}
	dst = appendHead(dst, majorMap, n)
	dst = appendTextKV(dst, subEndpoint, s.Endpoint)
	dst = appendTextKV(dst, subFilter, s.Filter)
	if maxAge {
		dst = appendUintKV(dst, subMaxAgeMs, s.MaxAgeMs)
	}
	if maxLayer {
		dst = appendUintKV(dst, subMaxLayer, s.MaxLayer)
	}
	return dst
}

// PaddingKey is the extension key [AppendSubscribePadded] writes. PROTOCOL §5
// reserves keys 0-63 for the specification and makes every decoder skip an
// unknown key, so a key from 64 up carries nothing a peer must understand.
const PaddingKey = 64

// AppendSubscribePadded is [AppendSubscribe] with one more entry after the
// others: [PaddingKey] holding a byte string of pad zero bytes (none when
// pad <= 0). A conforming decoder skips the entry (PROTOCOL §5), so the
// header means exactly what AppendSubscribe would have written; the bytes
// exist only to make the frame, and the QUIC packet carrying it, larger.
func AppendSubscribePadded(dst []byte, s *Subscribe, pad int) []byte {
	if pad <= 0 {
		return AppendSubscribe(dst, s)
	}
	dst = appendSubscribe(dst, s, 1)
	dst = appendHead(dst, majorUint, PaddingKey)
	dst = appendHead(dst, majorBytes, uint64(pad))
	for range pad {
		dst = append(dst, 0)
	}
	return dst
}

// DecodeSubscribe decodes a SUBSCRIBE header under every rule of PROTOCOL §5
// and §6.4. Every failure is an [*Error] for [KindSubscribe]. Endpoint and
// Filter share one string allocation.
func DecodeSubscribe(b []byte) (Subscribe, error) {
	return decodeSubscribe(b, KindSubscribe)
}

// DecodeUnsubscribe is [DecodeSubscribe] for an UNSUBSCRIBE header: the rules
// are the same, and errors name [KindUnsubscribe].
func DecodeUnsubscribe(b []byte) (Subscribe, error) {
	return decodeSubscribe(b, KindUnsubscribe)
}

func decodeSubscribe(b []byte, kind Kind) (Subscribe, error) {
	var s Subscribe
	d := decoder{b: b, frame: kind}
	m, err := d.openMap(-1)
	if err != nil {
		return Subscribe{}, err
	}
	var haveEndpoint, haveFilter bool
	for {
		key, ok, err := d.next(&m)
		if err != nil {
			return Subscribe{}, err
		}
		if !ok {
			break
		}
		k := keyInt(key)
		switch key {
		case subEndpoint:
			s.Endpoint, err = d.text(k, MaxEndpointBytes)
			haveEndpoint = true
		case subFilter:
			s.Filter, err = d.text(k, MaxFilterBytes)
			haveFilter = true
		case subMaxAgeMs:
			s.MaxAgeMs, err = d.uint(k)
			s.HasMaxAgeMs = true
		case subMaxLayer:
			s.MaxLayer, err = d.uint(k)
			s.HasMaxLayer = true
			if err == nil && s.MaxLayer > MaxLayer {
				err = d.failf(k, RuleLayerRange, "%d", s.MaxLayer)
			}
		default:
			err = d.skip(k)
		}
		if err != nil {
			return Subscribe{}, err
		}
	}
	if err := d.finish(); err != nil {
		return Subscribe{}, err
	}
	switch {
	case !haveEndpoint:
		return Subscribe{}, d.fail(subEndpoint, RuleMissingKey)
	case !haveFilter:
		return Subscribe{}, d.fail(subFilter, RuleMissingKey)
	}
	return s, nil
}

// Validate reports the first rule s breaks that [DecodeSubscribe] would
// refuse after [AppendSubscribe] (a cap, invalid UTF-8, MaxLayer above
// [MaxLayer]), as an [*Error]; nil when s encodes to a header a peer accepts.
// The filter grammar is not checked.
func (s *Subscribe) Validate() error {
	if err := checkText(KindSubscribe, subEndpoint, s.Endpoint, MaxEndpointBytes); err != nil {
		return err
	}
	if err := checkText(KindSubscribe, subFilter, s.Filter, MaxFilterBytes); err != nil {
		return err
	}
	if s.MaxLayer > MaxLayer {
		return &Error{Frame: KindSubscribe, Key: subMaxLayer, Rule: RuleLayerRange}
	}
	return nil
}
