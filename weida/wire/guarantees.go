package wire

import "fmt"

// The dimensions of a guarantee set, the keys of the nested map in HELLO keys
// 5 and 6 (PROTOCOL §6.5). Each value is a uint; the comment lists the levels
// and marks the core level, which is what an absent key means.
const (
	GuaranteeDelivery        uint64 = 0 // 0 BestEffort (core), 1 AtMostOnce, 2 AtLeastOnce
	GuaranteeAcknowledgement uint64 = 1 // 0 None, 1 TransportReceipt (core), 2 Accepted, 3 Stored, 4 Replicated, 5 Processed
	GuaranteeDurability      uint64 = 2 // 0 Written, 1 Flushed; only with acknowledgement 3 or 4
	GuaranteeReplicas        uint64 = 3 // replica count >= 2; only with acknowledgement 4
	GuaranteeOrdering        uint64 = 4 // 0 None (core), 1 PerProducer detect, 2 PerProducer reassemble, 3 PerKey, 4 Total
	GuaranteeDeduplication   uint64 = 5 // 0 None (core), 1 Bounded, 2 Durable
	GuaranteeDedupWindowMs   uint64 = 6 // window in ms; required with deduplication 1, forbidden otherwise
	GuaranteeBackpressure    uint64 = 7 // 0 Block (core), 1 Reject, 2 Drop, 3 Spill, 4 Coalesce
	GuaranteeProducerNaming  uint64 = 8 // 0 fingerprint (core), 1 stable
	GuaranteeControlIsolated uint64 = 9 // 0 no (core), 1 yes

	numDimensions = 10
)

// dimension describes one known dimension: its largest defined level (or
// unbounded) and its core level (or none, for the axes that exist only under
// another dimension's level).
var dimensions = [numDimensions]struct {
	max     uint64
	core    uint64
	hasCore bool
	name    string
}{
	{2, 0, true, "delivery"},
	{5, 1, true, "acknowledgement"},
	{1, 0, false, "durability"},
	{^uint64(0), 0, false, "replicas"},
	{4, 0, true, "ordering"},
	{2, 0, true, "deduplication"},
	{^uint64(0), 0, false, "dedup_window_ms"},
	{4, 0, true, "backpressure"},
	{1, 0, true, "producer_naming"},
	{1, 0, true, "control_isolated"},
}

// gset is a guarantee set with every known dimension resolved: present
// reports which keys carry a value, and level returns the value with the core
// default filled in.
type gset struct {
	v       [numDimensions]uint64
	present [numDimensions]bool
}

func (s *gset) level(dim uint64) uint64 {
	if s.present[dim] {
		return s.v[dim]
	}
	return dimensions[dim].core
}

// nonCore counts the entries an encoder writes: every present dimension
// except one stated at its core level.
func (s *gset) nonCore() int {
	n := 0
	for i := range s.v {
		if s.present[i] && !(dimensions[i].hasCore && s.v[i] == dimensions[i].core) {
			n++
		}
	}
	return n
}

// gsetOf resolves a caller's map. Unknown dimensions are not represented.
func gsetOf(m map[uint64]uint64) gset {
	var s gset
	for k, v := range m {
		if k < numDimensions {
			s.v[k], s.present[k] = v, true
		}
	}
	return s
}

// check applies PROTOCOL §6.5's value and combination rules; it returns the
// rule broken and a detail, or "".
func (s *gset) check() (rule, detail string) {
	for i := range s.v {
		if s.present[i] && s.v[i] > dimensions[i].max {
			return RuleGuaranteeLevel, fmt.Sprintf("%s %d", dimensions[i].name, s.v[i])
		}
	}
	ack := s.level(GuaranteeAcknowledgement)
	switch {
	case s.present[GuaranteeDurability] && ack != 3 && ack != 4:
		return RuleGuaranteeCombination, "durability without Stored or Replicated"
	case s.present[GuaranteeReplicas] && ack != 4:
		return RuleGuaranteeCombination, "replicas without Replicated"
	case s.present[GuaranteeReplicas] && s.v[GuaranteeReplicas] < 2:
		return RuleGuaranteeCombination, "replicas below 2"
	case s.level(GuaranteeDeduplication) == 1 && !s.present[GuaranteeDedupWindowMs]:
		return RuleGuaranteeCombination, "Bounded deduplication without dedup_window_ms"
	case s.level(GuaranteeDeduplication) != 1 && s.present[GuaranteeDedupWindowMs]:
		return RuleGuaranteeCombination, "dedup_window_ms without Bounded deduplication"
	case s.level(GuaranteeBackpressure) == 4 && s.level(GuaranteeOrdering) == 2:
		return RuleGuaranteeCombination, "Coalesce backpressure with PerProducer reassemble ordering"
	}
	return "", ""
}

// reaches reports whether offered meets required on every dimension
// (PROTOCOL §2.3 step 6, §6.1): ladders by level, the unordered dimensions
// (backpressure, producer naming) by equality, and the axes that exist only
// under a level (durability, replicas, dedup window) per axis.
func reaches(offered, required *gset) (ok bool, dim string) {
	for _, d := range []uint64{GuaranteeDelivery, GuaranteeAcknowledgement, GuaranteeOrdering,
		GuaranteeDeduplication, GuaranteeControlIsolated} {
		if offered.level(d) < required.level(d) {
			return false, dimensions[d].name
		}
	}
	for _, d := range []uint64{GuaranteeBackpressure, GuaranteeProducerNaming} {
		if offered.level(d) != required.level(d) {
			return false, dimensions[d].name
		}
	}
	for _, d := range []uint64{GuaranteeDurability, GuaranteeReplicas, GuaranteeDedupWindowMs} {
		if required.present[d] && (!offered.present[d] || offered.v[d] < required.v[d]) {
			return false, dimensions[d].name
		}
	}
	return true, ""
}

// decodeGuarantees reads the nested map of HELLO key 5 or 6 under every rule
// of PROTOCOL §5, validates it, and returns it without the dimensions stated
// at their core level; nil when nothing but core remains.
func (d *decoder) decodeGuarantees(key int) (map[uint64]uint64, gset, error) {
	var s gset
	m, err := d.openMap(key)
	if err != nil {
		return nil, s, err
	}
	for {
		k, ok, err := d.next(&m)
		if err != nil {
			return nil, s, err
		}
		if !ok {
			break
		}
		if k >= numDimensions {
			// A dimension this version does not know: skipped, and never
			// counted as agreed (§6.5).
			if err := d.skip(key); err != nil {
				return nil, s, err
			}
			continue
		}
		v, err := d.uint(key)
		if err != nil {
			return nil, s, err
		}
		s.v[k], s.present[k] = v, true
	}
	if rule, detail := s.check(); rule != "" {
		return nil, s, &Error{Frame: d.frame, Key: key, Rule: rule, Detail: detail}
	}
	n := s.nonCore()
	if n == 0 {
		return nil, s, nil
	}
	out := make(map[uint64]uint64, n)
	for i := range s.v {
		if s.present[i] && !(dimensions[i].hasCore && s.v[i] == dimensions[i].core) {
			out[uint64(i)] = s.v[i]
		}
	}
	return out, s, nil
}

// appendGuarantees writes key and a guarantee set map: the known dimensions
// not stated at their core level, in ascending order. Unknown dimensions in
// the caller's map are not written.
func appendGuarantees(dst []byte, key uint64, s *gset) []byte {
	dst = appendHead(dst, majorUint, key)
	dst = appendHead(dst, majorMap, uint64(s.nonCore()))
	for i := range s.v {
		if s.present[i] && !(dimensions[i].hasCore && s.v[i] == dimensions[i].core) {
			dst = appendUintKV(dst, uint64(i), s.v[i])
		}
	}
	return dst
}
