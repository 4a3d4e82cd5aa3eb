package wire

// Hello is the HELLO header (kind 0, PROTOCOL §6.1), the first and only frame
// of the uni stream each side opens after the handshake. Keys 0-4 are
// required.
//
// The zero value encodes as a HELLO with empty lists and zero limits; a v0
// peer sends Versions [0] and empty capability lists ([NewHello]).
type Hello struct {
	Versions             []uint64 // key 0: wire versions the sender speaks; v0 sends [0]
	MaxHeaderBytes       uint64   // key 1: largest header the sender accepts
	MaxTransfers         uint64   // key 2: advisory, not enforced
	Capabilities         []uint64 // key 3: capability codes supported; 1 = datagram
	RequiredCapabilities []uint64 // key 4: capability codes the peer must support

	// Keys 5 and 6: guarantee sets (PROTOCOL §6.5), keyed by the Guarantee*
	// dimension constants. nil means core, which is also what a set stating
	// only core levels means: the decoder returns nil for both, and the
	// encoder omits the key for both, so a core HELLO is byte-identical to a
	// v0 one. The decoder drops dimensions it does not know and levels stated
	// at core; the encoder writes only known dimensions not at core.
	GuaranteesOffered  map[uint64]uint64 // key 5
	GuaranteesRequired map[uint64]uint64 // key 6

	// Extensions are the keys from 64 up (PROTOCOL §5), ascending, each
	// with its value's encoded bytes (see ext.go for the ones this
	// package defines). The decoder keeps at most [MaxHelloExtensions] of
	// them, each value a copy, and skips every other unknown key.
	Extensions []Extension
}

// HELLO keys.
const (
	helloVersions = iota
	helloMaxHeaderBytes
	helloMaxTransfers
	helloCapabilities
	helloRequiredCapabilities
	helloGuaranteesOffered
	helloGuaranteesRequired
)

// NewHello returns the HELLO a v0 peer without datagrams sends: versions
// [0], the given limits, no capabilities, core guarantees.
func NewHello(maxHeaderBytes, maxTransfers uint64) Hello {
	return Hello{
		Versions:             []uint64{0},
		MaxHeaderBytes:       maxHeaderBytes,
		MaxTransfers:         maxTransfers,
		Capabilities:         []uint64{},
		RequiredCapabilities: []uint64{},
	}
}

// AppendHello appends h's CBOR header (not the preamble) to dst and returns
// the extended slice. nil and empty lists both encode as the empty array. It
// does not allocate when dst has room.
func AppendHello(dst []byte, h *Hello) []byte {
	off, req := gsetOf(h.GuaranteesOffered), gsetOf(h.GuaranteesRequired)
	n := uint64(5)
	if off.nonCore() > 0 {
		n++
	}
	if req.nonCore() > 0 {
		n++
	}
	n += uint64(len(h.Extensions))
	dst = appendHead(dst, majorMap, n)
	dst = appendUintList(dst, helloVersions, h.Versions)
	dst = appendUintKV(dst, helloMaxHeaderBytes, h.MaxHeaderBytes)
	dst = appendUintKV(dst, helloMaxTransfers, h.MaxTransfers)
	dst = appendUintList(dst, helloCapabilities, h.Capabilities)
	dst = appendUintList(dst, helloRequiredCapabilities, h.RequiredCapabilities)
	if off.nonCore() > 0 {
		dst = appendGuarantees(dst, helloGuaranteesOffered, &off)
	}
	if req.nonCore() > 0 {
		dst = appendGuarantees(dst, helloGuaranteesRequired, &req)
	}
	for _, e := range h.Extensions {
		dst = appendHead(dst, majorUint, e.Key)
		dst = append(dst, e.Value...)
	}
	return dst
}

// DecodeHello decodes a HELLO header under every rule of PROTOCOL §5 and
// §6.1: keys 0-4 present, lists of at most [MaxListItems] unsigned integers,
// guarantee sets whose levels and combinations §6.5 allows, and a required
// set the offered set reaches. Every failure is an [*Error]. The lists are
// non-nil, each its own allocation.
//
// Like [DecodeData] it follows the spec's key table one case per key.
func DecodeHello(b []byte) (Hello, error) {
	var h Hello
	d := decoder{b: b, frame: KindHello}
	m, err := d.openMap(-1)
	if err != nil {
		return Hello{}, err
	}
	var off, req gset
	var seen uint8
	for {
		key, ok, err := d.next(&m)
		if err != nil {
			return Hello{}, err
		}
		if !ok {
			break
		}
		k := keyInt(key)
		switch key {
		case helloVersions:
			h.Versions, err = d.uintList(k)
		case helloMaxHeaderBytes:
			h.MaxHeaderBytes, err = d.uint(k)
		case helloMaxTransfers:
			h.MaxTransfers, err = d.uint(k)
		case helloCapabilities:
			h.Capabilities, err = d.uintList(k)
		case helloRequiredCapabilities:
			h.RequiredCapabilities, err = d.uintList(k)
		case helloGuaranteesOffered:
			h.GuaranteesOffered, off, err = d.decodeGuarantees(k)
		case helloGuaranteesRequired:
			h.GuaranteesRequired, req, err = d.decodeGuarantees(k)
		default:
			start := d.off
			err = d.skip(k)
			if err == nil && key >= FirstExtensionKey && len(h.Extensions) < MaxHelloExtensions {
				h.Extensions = append(h.Extensions, Extension{Key: key, Value: append([]byte(nil), d.b[start:d.off]...)})
			}
		}
		if err != nil {
			return Hello{}, err
		}
		if key < 8 {
			seen |= 1 << key
		}
	}
	if err := d.finish(); err != nil {
		return Hello{}, err
	}
	for key := range 5 {
		if seen&(1<<key) == 0 {
			return Hello{}, &Error{Frame: KindHello, Key: key, Rule: RuleMissingKey}
		}
	}
	if ok, dim := reaches(&off, &req); !ok {
		return Hello{}, &Error{Frame: KindHello, Key: helloGuaranteesRequired, Rule: RuleGuaranteeRequired, Detail: dim}
	}
	return h, nil
}

// Validate reports the first rule h breaks that [DecodeHello] would refuse
// after [AppendHello] (a list over [MaxListItems], a guarantee level or
// combination PROTOCOL §6.5 forbids, a required set the offered set does not
// reach), as an [*Error]; nil when h encodes to a header a peer accepts.
func (h *Hello) Validate() error {
	for key, l := range [...][]uint64{h.Versions, nil, nil, h.Capabilities, h.RequiredCapabilities} {
		if len(l) > MaxListItems {
			return &Error{Frame: KindHello, Key: key, Rule: RuleListTooLong}
		}
	}
	off, req := gsetOf(h.GuaranteesOffered), gsetOf(h.GuaranteesRequired)
	if rule, detail := off.check(); rule != "" {
		return &Error{Frame: KindHello, Key: helloGuaranteesOffered, Rule: rule, Detail: detail}
	}
	if rule, detail := req.check(); rule != "" {
		return &Error{Frame: KindHello, Key: helloGuaranteesRequired, Rule: rule, Detail: detail}
	}
	if ok, dim := reaches(&off, &req); !ok {
		return &Error{Frame: KindHello, Key: helloGuaranteesRequired, Rule: RuleGuaranteeRequired, Detail: dim}
	}
	return validExtensions(h.Extensions)
}
