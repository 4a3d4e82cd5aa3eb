package wire

import "math/bits"

// Caps of the text and byte fields (PROTOCOL §6), in bytes, and the other
// per-key bounds the decoders enforce.
const (
	MaxEndpointBytes    = 512  // DATA, SUBSCRIBE, UNSUBSCRIBE key 0
	MaxContentTypeBytes = 256  // DATA key 2
	MaxTraceparentBytes = 128  // DATA key 3
	MaxTracestateBytes  = 512  // DATA key 4
	MaxTopicBytes       = 256  // DATA key 5
	MaxFilterBytes      = 256  // SUBSCRIBE, UNSUBSCRIBE key 1
	MaxMessageBytes     = 1024 // ERROR key 1
	ProducerBytes       = 32   // DATA key 7: exactly this long
	MaxReportItems      = 16   // DATA key 10
	MaxLayer            = 15   // DATA key 14, SUBSCRIBE key 3
	MaxAcknowledgement  = 5    // DATA key 8; levels 0 None ... 5 Processed
	ApplicationLevel    = 16   // DATA key 10: levels from here up are the application's
)

// DATA keys.
const (
	dataEndpoint = iota
	dataContentLen
	dataContentType
	dataTraceparent
	dataTracestate
	dataTopic
	dataSequence
	dataProducer
	dataAchieved
	dataReportID
	dataReport
	dataReportMode
	dataDeliveryAttempt
	dataSegment
	dataLayer
)

// Data is the DATA header (kind 1, PROTOCOL §6.2). Every key is optional at
// the decoder; whether endpoint is required depends on the stream (required
// on a uni stream and an initiating half, ignored on a reply half), which is
// the caller's business.
//
// Presence: a decoded Data has HasX set exactly for the keys that were
// present. AppendData writes a key with a Has flag when the flag is set or
// the value is not zero, so a caller sets the flag only to send a zero value
// (an empty endpoint or topic, sequence 0). A field without a Has flag is
// absent when zero; for ContentType, Traceparent and Tracestate an explicit
// empty string therefore decodes the same as an absent key, and for
// ReportMode and Layer an explicit 0 decodes the same as absent (PROTOCOL
// §6.2 never writes either).
//
// The zero value is the empty reply header A0.
type Data struct {
	Endpoint      string // key 0, at most MaxEndpointBytes
	HasEndpoint   bool
	ContentLen    uint64 // key 1; advisory: never size a buffer from it
	HasContentLen bool
	ContentType   string // key 2, "" = absent, at most MaxContentTypeBytes
	Traceparent   string // key 3, "" = absent, at most MaxTraceparentBytes
	Tracestate    string // key 4, "" = absent, at most MaxTracestateBytes
	Topic         string // key 5, at most MaxTopicBytes; "" is a valid topic
	HasTopic      bool
	Sequence      uint64 // key 6; meaningful only under negotiated PerProducer ordering
	HasSequence   bool
	Producer      []byte // key 7, nil = absent, else exactly ProducerBytes
	Achieved      uint64 // key 8, reply half only: acknowledgement level 0..MaxAcknowledgement
	HasAchieved   bool

	// Keys 9-14 serve the broker, report and radio patterns a v0 Pub/Sub
	// peer does not run; they are decoded and validated so that a header
	// using them round-trips exactly.
	ReportID           uint64 // key 9; only together with Report
	HasReportID        bool
	Report             []uint64 // key 10, nil = absent; at most MaxReportItems, strictly ascending, each <= MaxAcknowledgement or >= ApplicationLevel
	ReportMode         uint64   // key 11, 0 (progress) = absent, 1 = final-only
	DeliveryAttempt    uint64   // key 12; absent means 1
	HasDeliveryAttempt bool
	Segment            uint64 // key 13
	HasSegment         bool
	Layer              uint64 // key 14, 0 = absent; at most MaxLayer, only with Segment

	// Replay marks are this implementation's extension keys (PROTOCOL §5:
	// 64 and up, skipped by a peer that does not know them), written on
	// the copies a publisher replays from a last-value cache; see
	// docs/WEIDA.md, "Replayed copies". A live copy carries none.
	Replay ReplayMarks
	// SourceSequence is extension key DataSourceSequence (68): the
	// message's position in its source, such as a JetStream stream
	// sequence; 0 = absent (a JetStream sequence starts at 1).
	SourceSequence uint64
}

// DATA extension keys of the replay marks. Keys 0-63 are the
// specification's; these are the first of the extension space, which no
// registry allocates, so a decoder here reads a value of an unexpected type
// under one of them as absent (another extension's use) rather than as a
// violation.
const (
	DataKeyReplayed  = 65 // true: the copy is replayed from a cache, not live
	DataKeyAgeMillis = 66 // uint: how long before the replay the source delivered the value, in ms
	DataKeyStale     = 67 // true: the source was disconnected when the copy was replayed
)

// ReplayMarks are the extension keys of a replayed copy. The zero value
// writes nothing. Replayed, Stale and AgeMillis are written when set
// (true, or HasAge); false is never written, as PROTOCOL §5 writes no
// placeholder for an absent key.
type ReplayMarks struct {
	Replayed  bool   // key 65
	AgeMillis uint64 // key 66, when HasAge
	HasAge    bool
	Stale     bool // key 67
}

// count is the number of keys m writes.
func (m *ReplayMarks) count() uint64 {
	var n uint64
	for _, p := range [...]bool{m.Replayed, m.HasAge || m.AgeMillis != 0, m.Stale} {
		if p {
			n++
		}
	}
	return n
}

func (m *ReplayMarks) append(dst []byte) []byte {
	if m.Replayed {
		dst = appendHead(dst, majorUint, DataKeyReplayed)
		dst = append(dst, cborTrue)
	}
	if m.HasAge || m.AgeMillis != 0 {
		dst = appendUintKV(dst, DataKeyAgeMillis, m.AgeMillis)
	}
	if m.Stale {
		dst = appendHead(dst, majorUint, DataKeyStale)
		dst = append(dst, cborTrue)
	}
	return dst
}

// keys returns the set of keys AppendData writes for d, bit i for key i.
func (d *Data) keys() uint16 {
	var set uint16
	for key, p := range [...]bool{
		dataEndpoint:        d.HasEndpoint || d.Endpoint != "",
		dataContentLen:      d.HasContentLen || d.ContentLen != 0,
		dataContentType:     d.ContentType != "",
		dataTraceparent:     d.Traceparent != "",
		dataTracestate:      d.Tracestate != "",
		dataTopic:           d.HasTopic || d.Topic != "",
		dataSequence:        d.HasSequence || d.Sequence != 0,
		dataProducer:        d.Producer != nil,
		dataAchieved:        d.HasAchieved || d.Achieved != 0,
		dataReportID:        d.HasReportID || d.ReportID != 0,
		dataReport:          d.Report != nil,
		dataReportMode:      d.ReportMode != 0,
		dataDeliveryAttempt: d.HasDeliveryAttempt || d.DeliveryAttempt != 0,
		dataSegment:         d.HasSegment || d.Segment != 0,
		dataLayer:           d.Layer != 0,
	} {
		if p {
			set |= 1 << key
		}
	}
	return set
}

// AppendData appends d's CBOR header (not the preamble) to dst and returns
// the extended slice. It does not allocate when dst has room.
func AppendData(dst []byte, d *Data) []byte {
	set := d.keys()
	has := func(key int) bool { return set&(1<<key) != 0 }
	n := uint64(bits.OnesCount16(set)) + d.Replay.count()
	if d.SourceSequence != 0 {
		n++
	}
	dst = appendHead(dst, majorMap, n)
	if has(dataEndpoint) {
		dst = appendTextKV(dst, dataEndpoint, d.Endpoint)
	}
	if has(dataContentLen) {
		dst = appendUintKV(dst, dataContentLen, d.ContentLen)
	}
	if has(dataContentType) {
		dst = appendTextKV(dst, dataContentType, d.ContentType)
	}
	if has(dataTraceparent) {
		dst = appendTextKV(dst, dataTraceparent, d.Traceparent)
	}
	if has(dataTracestate) {
		dst = appendTextKV(dst, dataTracestate, d.Tracestate)
	}
	if has(dataTopic) {
		dst = appendTextKV(dst, dataTopic, d.Topic)
	}
	if has(dataSequence) {
		dst = appendUintKV(dst, dataSequence, d.Sequence)
	}
	if has(dataProducer) {
		dst = appendHead(dst, majorUint, dataProducer)
		dst = appendHead(dst, majorBytes, uint64(len(d.Producer)))
		dst = append(dst, d.Producer...)
	}
	if has(dataAchieved) {
		dst = appendUintKV(dst, dataAchieved, d.Achieved)
	}
	if has(dataReportID) {
		dst = appendUintKV(dst, dataReportID, d.ReportID)
	}
	if has(dataReport) {
		dst = appendUintList(dst, dataReport, d.Report)
	}
	if has(dataReportMode) {
		dst = appendUintKV(dst, dataReportMode, d.ReportMode)
	}
	if has(dataDeliveryAttempt) {
		dst = appendUintKV(dst, dataDeliveryAttempt, d.DeliveryAttempt)
	}
	if has(dataSegment) {
		dst = appendUintKV(dst, dataSegment, d.Segment)
	}
	if has(dataLayer) {
		dst = appendUintKV(dst, dataLayer, d.Layer)
	}
	// Extension keys ascend after the specification's: the replay marks
	// (65-67), then the source sequence (68).
	dst = d.Replay.append(dst)
	if d.SourceSequence != 0 {
		dst = appendUintKV(dst, DataSourceSequence, d.SourceSequence)
	}
	return dst
}

// DecodeData decodes a DATA header under every rule of PROTOCOL §5 and §6.2.
// Keys 15 and up are skipped, but for the replay marks ([ReplayMarks]) and
// the source sequence ([DataSourceSequence]), which are read when their
// value has the type they are written with and skipped otherwise. Every
// failure is an [*Error].
//
// The text fields of the result share one string allocation; Producer and
// Report are one allocation each when present.
//
// The function follows §6.2's key table one case per key, so that a reader
// can check it against the spec line by line; helpers would hide that.
func DecodeData(b []byte) (Data, error) {
	var out Data
	d := decoder{b: b, frame: KindData}
	m, err := d.openMap(-1)
	if err != nil {
		return Data{}, err
	}
	for {
		key, ok, err := d.next(&m)
		if err != nil {
			return Data{}, err
		}
		if !ok {
			break
		}
		k := keyInt(key)
		switch key {
		case dataEndpoint:
			out.Endpoint, err = d.text(k, MaxEndpointBytes)
			out.HasEndpoint = true
		case dataContentLen:
			out.ContentLen, err = d.uint(k)
			out.HasContentLen = true
		case dataContentType:
			out.ContentType, err = d.text(k, MaxContentTypeBytes)
		case dataTraceparent:
			out.Traceparent, err = d.text(k, MaxTraceparentBytes)
		case dataTracestate:
			out.Tracestate, err = d.text(k, MaxTracestateBytes)
		case dataTopic:
			out.Topic, err = d.text(k, MaxTopicBytes)
			out.HasTopic = true
		case dataSequence:
			out.Sequence, err = d.uint(k)
			out.HasSequence = true
		case dataProducer:
			out.Producer, err = d.bytesExact(k, ProducerBytes, RuleProducerLength)
		case dataAchieved:
			out.Achieved, err = d.uint(k)
			out.HasAchieved = true
			if err == nil && out.Achieved > MaxAcknowledgement {
				err = d.failf(k, RuleAchieved, "%d", out.Achieved)
			}
		case dataReportID:
			out.ReportID, err = d.uint(k)
			out.HasReportID = true
		case dataReport:
			out.Report, err = d.report(k)
		case dataReportMode:
			out.ReportMode, err = d.uint(k)
			if err == nil && out.ReportMode > 1 {
				err = d.failf(k, RuleReportMode, "%d", out.ReportMode)
			}
		case dataDeliveryAttempt:
			out.DeliveryAttempt, err = d.uint(k)
			out.HasDeliveryAttempt = true
		case dataSegment:
			out.Segment, err = d.uint(k)
			out.HasSegment = true
		case dataLayer:
			out.Layer, err = d.uint(k)
			switch {
			case err != nil:
			case !out.HasSegment:
				err = d.fail(k, RuleLayerWithoutSegment)
			case out.Layer > MaxLayer:
				err = d.failf(k, RuleLayerRange, "%d", out.Layer)
			}
		case DataKeyReplayed:
			out.Replay.Replayed, err = d.optTrue(k)
		case DataKeyAgeMillis:
			out.Replay.AgeMillis, out.Replay.HasAge, err = d.optUint(k)
		case DataKeyStale:
			out.Replay.Stale, err = d.optTrue(k)
		case DataSourceSequence:
			// An extension key: a value of another type is somebody
			// else's use of the number, skipped rather than refused.
			if d.off < len(d.b) && d.b[d.off]>>5 == majorUint {
				out.SourceSequence, err = d.uint(k)
			} else {
				err = d.skip(k)
			}
		default:
			err = d.skip(k)
		}
		if err != nil {
			return Data{}, err
		}
	}
	if err := d.finish(); err != nil {
		return Data{}, err
	}
	if out.HasReportID != (out.Report != nil) {
		return Data{}, d.fail(reportPairKey(out.HasReportID), RuleReportPair)
	}
	return out, nil
}

func reportPairKey(haveID bool) int {
	if haveID {
		return dataReportID
	}
	return dataReport
}

// report reads DATA key 10: at most MaxReportItems levels, strictly
// ascending, none undefined below ApplicationLevel.
func (d *decoder) report(k int) ([]uint64, error) {
	n, err := d.arrayLen(k, MaxReportItems, RuleReportTooLong)
	if err != nil {
		return nil, err
	}
	out := make([]uint64, n)
	for i := range out {
		v, err := d.uint(k)
		if err != nil {
			return nil, err
		}
		if rule := reportLevelRule(out[:i], v); rule != "" {
			return nil, d.failf(k, rule, "%d", v)
		}
		out[i] = v
	}
	return out, nil
}

// reportLevelRule checks level v following the levels before it.
func reportLevelRule(before []uint64, v uint64) string {
	if len(before) > 0 && v <= before[len(before)-1] {
		return RuleReportOrder
	}
	if v > MaxAcknowledgement && v < ApplicationLevel {
		return RuleReportLevel
	}
	return ""
}

// Validate reports the first rule d breaks that [DecodeData] would refuse
// after [AppendData], as an [*Error]; nil when d encodes to a header a peer
// accepts. It does not check which keys the stream requires (endpoint on an
// initiating stream).
func (d *Data) Validate() error {
	for _, t := range [...]struct {
		key int
		s   string
		max int
	}{
		{dataEndpoint, d.Endpoint, MaxEndpointBytes},
		{dataContentType, d.ContentType, MaxContentTypeBytes},
		{dataTraceparent, d.Traceparent, MaxTraceparentBytes},
		{dataTracestate, d.Tracestate, MaxTracestateBytes},
		{dataTopic, d.Topic, MaxTopicBytes},
	} {
		if err := checkText(KindData, t.key, t.s, t.max); err != nil {
			return err
		}
	}
	fail := func(key int, rule string) error { return &Error{Frame: KindData, Key: key, Rule: rule} }
	set := d.keys()
	switch {
	case d.Producer != nil && len(d.Producer) != ProducerBytes:
		return fail(dataProducer, RuleProducerLength)
	case d.Achieved > MaxAcknowledgement:
		return fail(dataAchieved, RuleAchieved)
	case len(d.Report) > MaxReportItems:
		return fail(dataReport, RuleReportTooLong)
	}
	for i, v := range d.Report {
		if rule := reportLevelRule(d.Report[:i], v); rule != "" {
			return fail(dataReport, rule)
		}
	}
	switch {
	case d.ReportMode > 1:
		return fail(dataReportMode, RuleReportMode)
	case d.Layer != 0 && set&(1<<dataSegment) == 0:
		return fail(dataLayer, RuleLayerWithoutSegment)
	case d.Layer > MaxLayer:
		return fail(dataLayer, RuleLayerRange)
	case (set&(1<<dataReportID) != 0) != (d.Report != nil):
		return fail(reportPairKey(d.Report == nil), RuleReportPair)
	}
	return nil
}
