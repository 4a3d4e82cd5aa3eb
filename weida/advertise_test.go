package weida

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"slices"
	"testing"

	"github.com/fxamacker/cbor/v2"
	"github.com/quic-go/quic-go"

	"weida.dev/connector/weida/wire"
)

func TestHelloAdvertisesReplay(t *testing.T) {
	l := listen(t, ListenConfig{})
	p := publisher(t, l, "/state")
	publisher(t, l, "/plain")

	// No Replayer yet: nothing is advertised.
	s := dial(t, l, "/state", DialConfig{})
	if _, ok := s.PeerReplays(); ok || s.PeerExtensions() != nil {
		t.Fatalf("advertised before SetReplayer: %+v", s.PeerExtensions())
	}

	var r storeReplayer
	p.SetReplayer(&r)
	s = dial(t, l, "/state", DialConfig{})
	ad, ok := s.PeerReplays()
	if !ok || ad.Version != wire.LastValueVersion || !slices.Equal(ad.Paths, []string{"/state"}) {
		t.Fatalf("PeerReplays = %+v, %v; want version 1 listing /state", ad, ok)
	}
	// The same HELLO speaks for the listener's other path, which does
	// not replay.
	other := dial(t, l, "/plain", DialConfig{})
	if ad, ok := other.PeerReplays(); ok || !slices.Equal(ad.Paths, []string{"/state"}) {
		t.Fatalf("PeerReplays on /plain = %+v, %v; want the ad, not covering /plain", ad, ok)
	}

	// Unset, or the publisher closed: no longer advertised.
	p.SetReplayer(nil)
	if s := dial(t, l, "/state", DialConfig{}); s.PeerExtensions() != nil {
		t.Fatalf("advertised after SetReplayer(nil): %+v", s.PeerExtensions())
	}
	p.SetReplayer(&r)
	p.Close()
	if s := dial(t, l, "/state", DialConfig{}); s.PeerExtensions() != nil {
		t.Fatalf("advertised after Close: %+v", s.PeerExtensions())
	}
}

func TestSourceSequenceOnReplayedAndLiveCopies(t *testing.T) {
	l := listen(t, ListenConfig{})
	p := publisher(t, l, "/state")
	var last Message
	p.SetReplayer(replayFunc(func(filter string, yield func(Message) bool) {
		if last.Topic != "" {
			yield(last)
		}
	}))
	m := Message{Topic: "a", SourceSequence: 41, Payload: []byte("old")}
	if _, err := p.PublishWith(testCtx(t), m, func() { last = m }); err != nil {
		t.Fatal(err)
	}
	s := dial(t, l, "/state", DialConfig{})
	subscribe(t, l, s, 1, "#")
	if got := receive(t, s); got.SourceSequence != 41 || string(got.Payload) != "old" {
		t.Fatalf("replayed copy = %+v, want sequence 41", got)
	}
	publish2 := func(seq uint64) {
		if _, err := p.Publish(testCtx(t), Message{Topic: "a", SourceSequence: seq, Payload: []byte("new")}); err != nil {
			t.Fatal(err)
		}
	}
	publish2(45)
	publish2(0) // a message with no sequence carries no key 68
	// Either order: weida core promises none across copies, and a copy
	// whose header the accept loop could not peek within its short
	// deadline (a loaded machine) is queued after the one behind it.
	got := []uint64{receive(t, s).SourceSequence, receive(t, s).SourceSequence}
	slices.Sort(got)
	if !slices.Equal(got, []uint64{0, 45}) {
		t.Fatalf("live copies' sequences = %v, want 45 and none (0)", got)
	}
}

type replayFunc func(filter string, yield func(Message) bool)

func (f replayFunc) Replay(filter string, yield func(Message) bool) { f(filter, yield) }

// An independent weida peer: plain quic-go and a general CBOR library
// (github.com/fxamacker/cbor) set to PROTOCOL §5's rules, none of this
// repository's codec. It knows HELLO keys 0-4 and DATA keys 0-5 only, as
// a v0 peer written from the specification does, and must be able to
// negotiate with a replaying publisher and read its copies, replayed and
// live, whatever extension keys they carry.
func TestIndependentPeerIgnoresExtensions(t *testing.T) {
	l := listen(t, ListenConfig{})
	p := publisher(t, l, "/state")
	// Set before SetReplayer, which the listener's goroutines read it after.
	last := Message{Topic: "room.a", SourceSequence: 9, Payload: []byte("cached")}
	p.SetReplayer(replayFunc(func(filter string, yield func(Message) bool) {
		yield(last)
	}))

	dm, err := cbor.DecOptions{
		DupMapKey:         cbor.DupMapKeyEnforcedAPF,
		IndefLength:       cbor.IndefLengthForbidden,
		TagsMd:            cbor.TagsForbidden,
		MaxNestedLevels:   9, // the header map and 8 levels of skipped value
		UTF8:              cbor.UTF8RejectInvalid,
		ExtraReturnErrors: cbor.ExtraDecErrorNone, // unknown keys are skipped
	}.DecMode()
	if err != nil {
		t.Fatal(err)
	}
	em, err := cbor.CoreDetEncOptions().EncMode() // deterministic: ascending keys, shortest ints
	if err != nil {
		t.Fatal(err)
	}
	type hello struct {
		Versions   []uint64 `cbor:"0,keyasint"`
		MaxHeader  uint64   `cbor:"1,keyasint"`
		MaxTrans   uint64   `cbor:"2,keyasint"`
		Caps       []uint64 `cbor:"3,keyasint"`
		RequireCap []uint64 `cbor:"4,keyasint"`
	}
	type data struct {
		Endpoint string `cbor:"0,keyasint,omitempty"`
		Topic    string `cbor:"5,keyasint,omitempty"`
	}
	frame := func(kind byte, v any) []byte {
		hdr, err := em.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		b := []byte{0x57, kind}
		b = quicVarint(b, uint64(len(hdr)))
		return append(b, hdr...)
	}
	readFrame := func(st *quic.ReceiveStream) (byte, []byte, []byte) {
		all, err := io.ReadAll(st)
		if err != nil {
			t.Fatalf("independent peer: read: %v", err)
		}
		if len(all) < 3 || all[0] != 0x57 {
			t.Fatalf("independent peer: bad preamble % X", all)
		}
		n, w := readQuicVarint(all[2:])
		hdr := all[2+w : 2+w+int(n)]
		return all[1], hdr, all[2+w+int(n):]
	}

	qc, err := quicDial(t, l, rawTLS())
	if err != nil {
		t.Fatal(err)
	}
	send := func(b []byte) {
		st, err := qc.OpenUniStreamSync(testCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Write(b); err != nil {
			t.Fatal(err)
		}
		_ = st.Close()
	}
	send(frame(0, hello{Versions: []uint64{0}, MaxHeader: 16384, MaxTrans: 1024, Caps: []uint64{}, RequireCap: []uint64{}}))
	send(frame(3, map[uint64]string{0: "/state", 1: "room.#"}))

	var gotHello bool
	var copies []string
	for len(copies) < 2 {
		st, err := qc.AcceptUniStream(testCtx(t))
		if err != nil {
			t.Fatalf("independent peer: accept: %v (connection: %v)", err, context.Cause(qc.Context()))
		}
		kind, hdr, payload := readFrame(st)
		switch kind {
		case 0:
			var h hello
			if err := dm.Unmarshal(hdr, &h); err != nil {
				t.Fatalf("independent peer: HELLO % X: %v", hdr, err)
			}
			// A general decoder sees the extension key too, well-formed.
			var all map[uint64]cbor.RawMessage
			if err := dm.Unmarshal(hdr, &all); err != nil {
				t.Fatalf("independent peer: HELLO as a map: %v", err)
			}
			if _, ok := all[wire.HelloLastValue]; !ok || !slices.Equal(h.Versions, []uint64{0}) {
				t.Fatalf("independent peer: HELLO %+v, keys %v", h, all)
			}
			gotHello = true
		case 1:
			var d data
			if err := dm.Unmarshal(hdr, &d); err != nil {
				t.Fatalf("independent peer: DATA % X: %v", hdr, err)
			}
			if d.Endpoint != "/state" || d.Topic != "room.a" {
				t.Fatalf("independent peer: DATA %+v", d)
			}
			if !bytes.Contains(hdr, []byte{0x18, wire.DataSourceSequence}) {
				t.Fatalf("independent peer: DATA % X carries no key 68 to ignore", hdr)
			}
			copies = append(copies, string(payload))
			if len(copies) == 1 {
				// The replayed copy came: the subscription is held.
				if res, err := p.Publish(testCtx(t), Message{Topic: "room.a", SourceSequence: 10, Payload: []byte("live")}); err != nil || res.Queued != 1 {
					t.Fatalf("live publish: %+v, %v", res, err)
				}
			}
		default:
			t.Fatalf("independent peer: kind %d", kind)
		}
	}
	slices.Sort(copies)
	if !gotHello || !slices.Equal(copies, []string{"cached", "live"}) {
		t.Fatalf("independent peer got HELLO %v, copies %q", gotHello, copies)
	}
	if qc.Context().Err() != nil {
		t.Fatalf("connection ended: %v", context.Cause(qc.Context()))
	}
}

func quicVarint(b []byte, v uint64) []byte {
	switch {
	case v < 1<<6:
		return append(b, byte(v))
	case v < 1<<14:
		return binary.BigEndian.AppendUint16(b, uint16(v)|0x4000)
	case v < 1<<30:
		return binary.BigEndian.AppendUint32(b, uint32(v)|0x80000000)
	}
	return binary.BigEndian.AppendUint64(b, v|0xC000000000000000)
}

func readQuicVarint(b []byte) (uint64, int) {
	w := 1 << (b[0] >> 6)
	v := uint64(b[0] & 0x3f)
	for _, c := range b[1:w] {
		v = v<<8 | uint64(c)
	}
	return v, w
}
