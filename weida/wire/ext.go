package wire

import (
	"fmt"
	"slices"
)

// Extension keys. PROTOCOL §5 keeps keys 0-63 of every header for the
// specification and gives keys from 64 up to extensions, which a peer that
// does not know them skips. The numbers below are this implementation's;
// docs/WEIDA.md says what each means.
const (
	// FirstExtensionKey is the lowest key an extension may use.
	FirstExtensionKey = 64

	// HelloLastValue is the HELLO key of the last-value advertisement: the
	// sending endpoint replays last values to new subscriptions. Its value
	// is a [LastValueAd] map.
	HelloLastValue = 64

	// DataSourceSequence is the DATA key of the source sequence: the
	// position the bridged message has in its source (a JetStream stream
	// sequence), the same on a replayed and a live copy of one message.
	DataSourceSequence = 68
)

// MaxHelloExtensions bounds the extension keys [DecodeHello] keeps from
// one HELLO; further ones are skipped like any unknown key.
const MaxHelloExtensions = MaxListItems

// Extension is one extension key of a HELLO and its value: one CBOR data
// item, held as its encoded bytes, which obey PROTOCOL §5 (no tags, no
// indefinite lengths, nesting within the skip depth).
type Extension struct {
	Key   uint64
	Value []byte
}

// validExtensions checks what [AppendHello] is to write for exts: keys
// from FirstExtensionKey, strictly ascending, each value exactly one item
// a peer's skipper accepts.
func validExtensions(exts []Extension) error {
	if len(exts) > MaxHelloExtensions {
		return &Error{Frame: KindHello, Key: -1, Rule: RuleListTooLong, Detail: fmt.Sprintf("%d extensions", len(exts))}
	}
	for i, e := range exts {
		k := keyInt(e.Key)
		switch {
		case e.Key < FirstExtensionKey:
			return &Error{Frame: KindHello, Key: k, Rule: RuleExtensionKey}
		case i > 0 && e.Key <= exts[i-1].Key:
			return &Error{Frame: KindHello, Key: k, Rule: RuleKeyOrder}
		}
		d := decoder{b: e.Value, frame: KindHello}
		if err := d.skip(k); err != nil {
			return err
		}
		if d.off != len(e.Value) {
			return &Error{Frame: KindHello, Key: k, Rule: RuleTrailingBytes}
		}
	}
	return nil
}

// LastValueAd is the value of HELLO key [HelloLastValue], a map:
//
//	0 version  uint    required; this package writes 1
//	1 paths    [tstr]  optional; the publisher paths of the sender that
//	                   replay, when the sender lists them
//
// A listener sends one HELLO for all its paths before it knows which one a
// subscriber dialled, hence the list. Absent paths means the sender did
// not list them (too many to fit), not that none replays. Unknown keys of
// the map are skipped, so a later version may add some.
type LastValueAd struct {
	Version uint64
	Paths   []string // nil: not listed
}

// LastValueVersion is the version of the last-value extension this
// package speaks.
const LastValueVersion = 1

// Bounds of the path list an advertisement carries, so that the HELLO
// stays far below the smallest max_header_bytes a peer is likely to have.
const (
	MaxAdPaths     = MaxListItems
	MaxAdPathBytes = 4096 // summed over the paths
)

// AppendLastValueAd appends the CBOR value of ad. Paths beyond
// [MaxAdPaths] or [MaxAdPathBytes], or a path over [MaxEndpointBytes],
// make it leave the list out.
func AppendLastValueAd(dst []byte, ad *LastValueAd) []byte {
	list := ad.Paths != nil && len(ad.Paths) <= MaxAdPaths
	total := 0
	for _, p := range ad.Paths {
		total += len(p)
		if checkText(KindHello, HelloLastValue, p, MaxEndpointBytes) != nil {
			list = false
		}
	}
	if total > MaxAdPathBytes {
		list = false
	}
	n := uint64(1)
	if list {
		n++
	}
	dst = appendHead(dst, majorMap, n)
	dst = appendUintKV(dst, 0, ad.Version)
	if list {
		dst = appendHead(dst, majorUint, 1)
		dst = appendHead(dst, majorArray, uint64(len(ad.Paths)))
		for _, p := range ad.Paths {
			dst = appendHead(dst, majorText, uint64(len(p)))
			dst = append(dst, p...)
		}
	}
	return dst
}

// DecodeLastValueAd decodes the value of HELLO key [HelloLastValue] under
// the rules of PROTOCOL §5 for a nested map. A HELLO whose advertisement
// fails here is still a valid HELLO (the extension is not the
// specification's): the caller treats the advertisement as absent.
func DecodeLastValueAd(b []byte) (LastValueAd, error) {
	var ad LastValueAd
	d := decoder{b: b, frame: KindHello}
	const k = HelloLastValue
	m, err := d.openMap(k)
	if err != nil {
		return LastValueAd{}, err
	}
	haveVersion := false
	for {
		key, ok, err := d.next(&m)
		if err != nil {
			return LastValueAd{}, err
		}
		if !ok {
			break
		}
		switch key {
		case 0:
			ad.Version, err = d.uint(k)
			haveVersion = true
		case 1:
			var n int
			n, err = d.arrayLen(k, MaxAdPaths, RuleListTooLong)
			if err == nil {
				ad.Paths = make([]string, 0, n)
			}
			for range n {
				var s string
				if s, err = d.text(k, MaxEndpointBytes); err != nil {
					break
				}
				ad.Paths = append(ad.Paths, s)
			}
		default:
			err = d.skip(k)
		}
		if err != nil {
			return LastValueAd{}, err
		}
	}
	if err := d.finish(); err != nil {
		return LastValueAd{}, err
	}
	if !haveVersion {
		return LastValueAd{}, &Error{Frame: KindHello, Key: k, Rule: RuleMissingKey}
	}
	return ad, nil
}

// Covers reports whether ad says path replays: the path is listed, or the
// sender did not list its paths.
func (ad *LastValueAd) Covers(path string) bool {
	return ad.Paths == nil || slices.Contains(ad.Paths, path)
}

// Extension returns the value of extension key k in h, or nil.
func (h *Hello) Extension(k uint64) []byte {
	i, ok := slices.BinarySearchFunc(h.Extensions, k, func(e Extension, k uint64) int {
		switch {
		case e.Key < k:
			return -1
		case e.Key > k:
			return 1
		}
		return 0
	})
	if !ok {
		return nil
	}
	return h.Extensions[i].Value
}
