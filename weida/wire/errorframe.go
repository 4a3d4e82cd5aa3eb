package wire

// ErrorFrame is the ERROR header (kind 2, PROTOCOL §6.3), legal only on the
// reply half of a bidirectional stream, where it replaces the reply. Key 0 is
// required.
type ErrorFrame struct {
	Code    uint64 // key 0: one of the Error* codes; read any other as a generic failure
	Message string // key 1, "" = absent, at most MaxMessageBytes; informational only
}

// AppendErrorFrame appends e's CBOR header (not the preamble) to dst and
// returns the extended slice. It does not allocate when dst has room.
func AppendErrorFrame(dst []byte, e *ErrorFrame) []byte {
	if e.Message == "" {
		dst = appendHead(dst, majorMap, 1)
		return appendUintKV(dst, 0, e.Code)
	}
	dst = appendHead(dst, majorMap, 2)
	dst = appendUintKV(dst, 0, e.Code)
	return appendTextKV(dst, 1, e.Message)
}

// DecodeErrorFrame decodes an ERROR header under every rule of PROTOCOL §5
// and §6.3. An undefined code is not an error. Every failure is an [*Error].
func DecodeErrorFrame(b []byte) (ErrorFrame, error) {
	var e ErrorFrame
	d := decoder{b: b, frame: KindError}
	m, err := d.openMap(-1)
	if err != nil {
		return ErrorFrame{}, err
	}
	haveCode := false
	for {
		key, ok, err := d.next(&m)
		if err != nil {
			return ErrorFrame{}, err
		}
		if !ok {
			break
		}
		k := keyInt(key)
		switch key {
		case 0:
			e.Code, err = d.uint(k)
			haveCode = true
		case 1:
			e.Message, err = d.text(k, MaxMessageBytes)
		default:
			err = d.skip(k)
		}
		if err != nil {
			return ErrorFrame{}, err
		}
	}
	if err := d.finish(); err != nil {
		return ErrorFrame{}, err
	}
	if !haveCode {
		return ErrorFrame{}, d.fail(0, RuleMissingKey)
	}
	return e, nil
}

// Validate reports the rule e breaks that [DecodeErrorFrame] would refuse
// after [AppendErrorFrame] (the message cap, invalid UTF-8), as an [*Error];
// nil when e encodes to a header a peer accepts.
func (e *ErrorFrame) Validate() error {
	return checkText(KindError, 1, e.Message, MaxMessageBytes)
}
