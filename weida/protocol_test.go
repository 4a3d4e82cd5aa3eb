package weida

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/quic-go/quic-go"

	"weida.dev/connector/weida/wire"
)

func hello(mod func(*wire.Hello)) wire.Hello {
	h := wire.NewHello(16384, 1024)
	if mod != nil {
		mod(&h)
	}
	return h
}

func TestNegotiate(t *testing.T) {
	ours := localHello(&Limits{MaxHeaderBytes: 16384, MaxConcurrentUniStreams: 2048, MaxConcurrentBidiStreams: 1024})
	cases := []struct {
		name   string
		theirs wire.Hello
		ok     bool
	}{
		{"v0 peer", hello(nil), true},
		{"several versions", hello(func(h *wire.Hello) { h.Versions = []uint64{3, 0, 1} }), true},
		{"no common version", hello(func(h *wire.Hello) { h.Versions = []uint64{1, 2} }), false},
		{"no version at all", hello(func(h *wire.Hello) { h.Versions = []uint64{} }), false},
		{"offers datagrams", hello(func(h *wire.Hello) { h.Capabilities = []uint64{1} }), true},
		{"requires datagrams", hello(func(h *wire.Hello) { h.RequiredCapabilities = []uint64{1} }), false},
		{"requires an unknown capability", hello(func(h *wire.Hello) { h.RequiredCapabilities = []uint64{7} }), false},
		{"offers ordering", hello(func(h *wire.Hello) { h.GuaranteesOffered = map[uint64]uint64{wire.GuaranteeOrdering: 1} }), true},
		{"requires ordering", hello(func(h *wire.Hello) {
			h.GuaranteesOffered = map[uint64]uint64{wire.GuaranteeOrdering: 1}
			h.GuaranteesRequired = map[uint64]uint64{wire.GuaranteeOrdering: 1}
		}), false},
		{"requires Accepted", hello(func(h *wire.Hello) {
			h.GuaranteesOffered = map[uint64]uint64{wire.GuaranteeAcknowledgement: 2}
			h.GuaranteesRequired = map[uint64]uint64{wire.GuaranteeAcknowledgement: 2}
		}), false},
		{"requires less than core", hello(func(h *wire.Hello) {
			h.GuaranteesOffered = map[uint64]uint64{wire.GuaranteeAcknowledgement: 0}
			h.GuaranteesRequired = map[uint64]uint64{wire.GuaranteeAcknowledgement: 0}
		}), true},
		{"offers another backpressure", hello(func(h *wire.Hello) { h.GuaranteesOffered = map[uint64]uint64{wire.GuaranteeBackpressure: 2} }), false},
		{"offers stable producer naming", hello(func(h *wire.Hello) { h.GuaranteesOffered = map[uint64]uint64{wire.GuaranteeProducerNaming: 1} }), false},
		{"offers storage, requires nothing", hello(func(h *wire.Hello) {
			h.GuaranteesOffered = map[uint64]uint64{wire.GuaranteeAcknowledgement: 3, wire.GuaranteeDurability: 1}
		}), true},
		{"requires durability", hello(func(h *wire.Hello) {
			h.GuaranteesOffered = map[uint64]uint64{wire.GuaranteeAcknowledgement: 3, wire.GuaranteeDurability: 1}
			h.GuaranteesRequired = map[uint64]uint64{wire.GuaranteeAcknowledgement: 3, wire.GuaranteeDurability: 1}
		}), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, err := negotiate(&ours, &c.theirs)
			if (err == nil) != c.ok {
				t.Fatalf("negotiate = %+v, %v; want ok=%v", a, err, c.ok)
			}
			if c.ok && (a.version != 0 || a.sendMaxHeaderBytes != c.theirs.MaxHeaderBytes || a.datagrams) {
				t.Errorf("agreed %+v", a)
			}
		})
	}
}

// TestHelloNegotiationFailure: a peer whose HELLO cannot be met is closed
// with NEGOTIATION_FAILED, by the listener and by a dialling subscriber.
func TestHelloNegotiationFailure(t *testing.T) {
	bad := map[string]wire.Hello{
		"version 1 only":     hello(func(h *wire.Hello) { h.Versions = []uint64{1} }),
		"requires datagrams": hello(func(h *wire.Hello) { h.RequiredCapabilities = []uint64{1} }),
		"requires ordering": hello(func(h *wire.Hello) {
			h.GuaranteesOffered = map[uint64]uint64{wire.GuaranteeOrdering: 1}
			h.GuaranteesRequired = map[uint64]uint64{wire.GuaranteeOrdering: 1}
		}),
	}
	l := listen(t, ListenConfig{})
	for name, h := range bad {
		t.Run("listener/"+name, func(t *testing.T) {
			r := rawDial(t, l)
			r.send(helloFrame(h))
			if ae := r.closed(); ae.ErrorCode != quic.ApplicationErrorCode(NegotiationFailed) {
				t.Fatalf("closed with %v, want NEGOTIATION_FAILED", ae)
			}
		})
		t.Run("subscriber/"+name, func(t *testing.T) {
			srv := rawListen(t)
			srv.start(func(qc *quic.Conn) { sendUni(qc, helloFrame(h)) })
			_, err := Dial(testCtx(t), srv.url("/p"), DialConfig{InsecureSkipVerifyForTesting: true})
			if err == nil || !strings.Contains(err.Error(), "NEGOTIATION_FAILED") {
				t.Fatalf("Dial = %v, want NEGOTIATION_FAILED", err)
			}
		})
	}
	if st := l.Stats(); st.NegotiationFailures != uint64(len(bad)) {
		t.Errorf("NegotiationFailures = %d", st.NegotiationFailures)
	}
}

// TestHelloTimeout: a peer that sends no HELLO is closed with
// NEGOTIATION_FAILED once hello_timeout passes (shortened here; the test
// waits for the close, it does not time it).
func TestHelloTimeout(t *testing.T) {
	l := listen(t, ListenConfig{Limits: Limits{HelloTimeout: 50e6}})
	r := rawDial(t, l)
	if ae := r.closed(); ae.ErrorCode != quic.ApplicationErrorCode(NegotiationFailed) {
		t.Fatalf("closed with %v, want NEGOTIATION_FAILED", ae)
	}
	// The dialling side applies it too.
	srv := rawListen(t)
	srv.start(func(*quic.Conn) {})
	_, err := Dial(testCtx(t), srv.url("/p"), DialConfig{InsecureSkipVerifyForTesting: true, Limits: Limits{HelloTimeout: 50e6}})
	if err == nil || !strings.Contains(err.Error(), "NEGOTIATION_FAILED") {
		t.Fatalf("Dial to a silent server = %v, want NEGOTIATION_FAILED", err)
	}
}

// TestParkedBeforeHello: a SUBSCRIBE that arrives before the peer's HELLO
// waits for it (no error) and then takes effect.
func TestParkedBeforeHello(t *testing.T) {
	l := listen(t, ListenConfig{})
	p := publisher(t, l, "/md")
	r := rawDial(t, l)
	r.send(subscribeFrame(wire.KindSubscribe, "/md", "px.#"))
	waitFor(t, "the SUBSCRIBE to be parked", func() bool { return l.Stats().StreamsParked == 1 })
	if l.Stats().Subscriptions != 0 {
		t.Fatal("a SUBSCRIBE was processed before HELLO")
	}
	r.hello()
	waitFor(t, "the parked SUBSCRIBE to be applied", func() bool { return l.Stats().Subscriptions == 1 })
	publish(t, p, "px.eur", []byte("1.08"))
	d, payload := r.nextData()
	if d.Endpoint != "/md" || d.Topic != "px.eur" || string(payload) != "1.08" {
		t.Fatalf("received %+v %q", d, payload)
	}
	if r.qc.Context().Err() != nil {
		t.Fatal("connection closed")
	}
}

// TestParkedBeforeHelloSubscriber: a copy that reaches a subscriber before
// the publisher's HELLO is parked and then delivered.
func TestParkedBeforeHelloSubscriber(t *testing.T) {
	srv := rawListen(t)
	srv.start(func(qc *quic.Conn) {
		// Stream order makes the subscriber accept this before the HELLO;
		// whether its goroutine parks it or finds the HELLO done, the copy
		// must be delivered.
		sendUni(qc, dataFrame("/p", "early", []byte("x")))
		sendUni(qc, helloFrame(hello(nil)))
	})
	s, err := Dial(testCtx(t), srv.url("/p"), DialConfig{InsecureSkipVerifyForTesting: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if m := receive(t, s); m.Topic != "early" {
		t.Fatalf("received %+v", m)
	}
}

// violations lists, per PROTOCOL §3.2 condition, the bytes a hostile peer
// sends after a valid HELLO on a uni stream (or a bidi stream when bidi is
// set), each of which must close that connection with PROTOCOL_VIOLATION.
var violations = []struct {
	name  string
	bytes []byte
	bidi  bool
}{
	{"bad magic", []byte{0x58, 0x03, 0x01, 0xA0}, false},
	{"reserved kind 8", []byte{0x57, 0x08, 0x01, 0xA0}, false},
	{"reserved kind 255", []byte{0x57, 0xFF, 0x00}, false},
	{"header_len over max_header_bytes", []byte{0x57, 0x03, 0x80, 0x00, 0x40, 0x01}, false},
	{"header_len 8-byte varint over max", []byte{0x57, 0x03, 0xC0, 0, 0, 0, 0, 0, 0x40, 0x01}, false},
	{"truncated preamble", []byte{0x57, 0x03}, false},
	{"empty stream", []byte{}, false},
	{"CBOR not a map", frameOf(wire.KindSubscribe, []byte{0x80}), false},
	{"CBOR indefinite map", frameOf(wire.KindSubscribe, []byte{0xBF, 0xFF}), false},
	{"CBOR truncated", frameOf(wire.KindSubscribe, []byte{0xA2, 0x00, 0x62, 0x2F}), false},
	{"trailing bytes", frameOf(wire.KindSubscribe, []byte{0xA2, 0x00, 0x62, 0x2F, 0x74, 0x01, 0x60, 0x00}), false},
	{"missing required key", frameOf(wire.KindSubscribe, []byte{0xA1, 0x00, 0x62, 0x2F, 0x74}), false},
	{"duplicate key", frameOf(wire.KindSubscribe, []byte{0xA3, 0x00, 0x62, 0x2F, 0x74, 0x00, 0x62, 0x2F, 0x74, 0x01, 0x60}), false},
	{"keys out of order", frameOf(wire.KindSubscribe, []byte{0xA2, 0x01, 0x60, 0x00, 0x62, 0x2F, 0x74}), false},
	{"non-uint key", frameOf(wire.KindSubscribe, []byte{0xA2, 0x61, 0x61, 0x00, 0x00, 0x62, 0x2F, 0x74}), false},
	{"wrong type", frameOf(wire.KindSubscribe, []byte{0xA2, 0x00, 0x01, 0x01, 0x60}), false},
	{"CBOR tag", frameOf(wire.KindSubscribe, []byte{0xA2, 0x00, 0xC0, 0x62, 0x2F, 0x74, 0x01, 0x60}), false},
	{"filter over 256 bytes", subscribeFrame(wire.KindSubscribe, "/md", strings.Repeat("a", 257)), false},
	{"filter not UTF-8", subscribeFrame(wire.KindSubscribe, "/md", "a\xff"), false},
	{"illegal filter a*b", subscribeFrame(wire.KindSubscribe, "/md", "a*b"), false},
	{"illegal filter #.a", subscribeFrame(wire.KindUnsubscribe, "/md", "#.a"), false},
	{"max_layer 16", frameOf(wire.KindSubscribe, []byte{0xA3, 0x00, 0x62, 0x2F, 0x74, 0x01, 0x61, 0x61, 0x03, 0x10}), false},
	{"ERROR on a uni stream", frameOf(wire.KindError, []byte{0xA1, 0x00, 0x05}), false},
	{"DATA without endpoint", frameOf(wire.KindData, []byte{0xA0}), false},
	{"DATA layer 16", frameOf(wire.KindData, []byte{0xA2, 0x0D, 0x05, 0x0E, 0x10}), false},
	{"DATA layer without segment", frameOf(wire.KindData, []byte{0xA1, 0x0E, 0x01}), false},
	{"FLOW without datagram capability", frameOf(wire.KindFlow, []byte{0xA2, 0x00, 0x62, 0x2F, 0x76, 0x01, 0x07}), false},
	{"second HELLO", helloFrame(hello(nil)), false},
	{"SUBSCRIBE on a bidi stream", subscribeFrame(wire.KindSubscribe, "/md", "a"), true},
	{"bidi DATA without endpoint", frameOf(wire.KindData, []byte{0xA0}), true},
	{"bidi reserved kind", []byte{0x57, 0x09, 0x01, 0xA0}, true},
}

// TestHostile feeds each §3.2 violation to the listener on one connection
// and checks that only that connection is closed, with PROTOCOL_VIOLATION,
// while a second, well-behaved connection keeps receiving.
func TestHostile(t *testing.T) {
	l := listen(t, ListenConfig{})
	p := publisher(t, l, "/md")
	good := dial(t, l, "/md", DialConfig{})
	subscribe(t, l, good, 1, "")
	for i, v := range violations {
		t.Run(v.name, func(t *testing.T) {
			r := rawDial(t, l)
			r.hello()
			if v.bidi {
				st, err := r.qc.OpenStreamSync(testCtx(t))
				if err != nil {
					t.Fatal(err)
				}
				_, _ = st.Write(v.bytes)
				_ = st.Close()
			} else {
				st, err := r.qc.OpenUniStreamSync(testCtx(t))
				if err != nil {
					t.Fatal(err)
				}
				_, _ = st.Write(v.bytes)
				_ = st.Close()
			}
			if ae := r.closed(); ae.ErrorCode != quic.ApplicationErrorCode(ProtocolViolation) || !ae.Remote {
				t.Fatalf("closed with %v, want PROTOCOL_VIOLATION from the listener", ae)
			}
			payload := []byte(fmt.Sprint(i))
			if r := publish(t, p, "after", payload); r.Queued != 1 {
				t.Fatalf("publish after the violation: %+v", r)
			}
			if m := receive(t, good); !bytes.Equal(m.Payload, payload) {
				t.Fatalf("the good connection received %q, want %q", m.Payload, payload)
			}
		})
	}
	if st := l.Stats(); st.ProtocolViolations != uint64(len(violations)) {
		t.Errorf("ProtocolViolations = %d, want %d", st.ProtocolViolations, len(violations))
	}
}

// TestHostileToSubscriber: the same rules bind a subscriber; a violating
// publisher gets PROTOCOL_VIOLATION.
func TestHostileToSubscriber(t *testing.T) {
	for _, v := range violations {
		if strings.HasPrefix(v.name, "illegal filter") {
			continue // a subscriber registers no publisher and ignores SUBSCRIBE (PROTOCOL §6.4)
		}
		t.Run(v.name, func(t *testing.T) {
			srv := rawListen(t)
			closed := make(chan *quic.ApplicationError, 1)
			srv.start(func(qc *quic.Conn) {
				sendUni(qc, helloFrame(hello(nil)))
				if v.bidi {
					st, err := qc.OpenStreamSync(qc.Context())
					if err == nil {
						_, _ = st.Write(v.bytes)
						_ = st.Close()
					}
				} else {
					sendUni(qc, v.bytes)
				}
				<-qc.Context().Done()
				closed <- appErr(qc)
			})
			s, err := Dial(testCtx(t), srv.url("/md"), DialConfig{InsecureSkipVerifyForTesting: true})
			if err == nil {
				defer s.Close()
			}
			if ae := <-closed; ae == nil || ae.ErrorCode != quic.ApplicationErrorCode(ProtocolViolation) {
				t.Fatalf("publisher's connection closed with %v, want PROTOCOL_VIOLATION", ae)
			}
		})
	}
}

// TestRefusals: dispatch refusals of PROTOCOL §9.4 answer the stream and
// leave the connection alive; CREDIT is ignored and CURSOR cancelled.
func TestRefusals(t *testing.T) {
	l := listen(t, ListenConfig{})
	p := publisher(t, l, "/pub")
	r := rawDial(t, l)
	r.hello()

	uni := []struct {
		name  string
		bytes []byte
		code  Code
	}{
		{"DATA to a publisher path", dataFrame("/pub", "t", []byte("x")), Unsupported},
		{"DATA to an unknown path", dataFrame("/nowhere", "t", []byte("x")), UnknownEndpoint},
		{"CURSOR", frameOf(wire.KindCursor, []byte{0xA1, 0x00, 0x01}), Canceled},
	}
	for _, c := range uni {
		t.Run(c.name, func(t *testing.T) {
			st := r.sendOpen(c.bytes)
			if got := stopCode(t, st); got != quic.StreamErrorCode(c.code) {
				t.Fatalf("STOP_SENDING %d, want %v", got, c.code)
			}
		})
	}
	bidi := []struct {
		name    string
		path    string
		code    Code
		errCode uint64
	}{
		{"exchange with a publisher path", "/pub", Unsupported, wire.ErrorUnsupported},
		{"exchange with an unknown path", "/nowhere", UnknownEndpoint, wire.ErrorUnknownEndpoint},
	}
	for _, c := range bidi {
		t.Run(c.name, func(t *testing.T) {
			st, err := r.qc.OpenStreamSync(testCtx(t))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := st.Write(dataFrame(c.path, "", []byte("request"))); err != nil {
				t.Fatal(err)
			}
			reply, err := io.ReadAll(st)
			if err != nil {
				t.Fatalf("reading the reply half: %v", err)
			}
			k, hdr, n, err := wire.ParsePreamble(reply, 16384)
			if err != nil || k != wire.KindError || n != len(reply) {
				t.Fatalf("reply %x: kind %v, %v", reply, k, err)
			}
			if e, err := wire.DecodeErrorFrame(hdr); err != nil || e.Code != c.errCode {
				t.Fatalf("ERROR %+v, %v; want code %d", e, err, c.errCode)
			}
			if got := stopCodeCtx(t, st.Context()); got != quic.StreamErrorCode(c.code) {
				t.Fatalf("request half stopped with %d, want %v", got, c.code)
			}
		})
	}
	// CREDIT is ignored; unknown UNSUBSCRIBE is ignored.
	r.send(frameOf(wire.KindCredit, []byte{0xA3, 0x00, 0x65, 0x2F, 0x6A, 0x6F, 0x62, 0x73, 0x01, 0x60, 0x02, 0x00}))
	r.send(subscribeFrame(wire.KindUnsubscribe, "/pub", "never.subscribed"))
	r.send(subscribeFrame(wire.KindUnsubscribe, "/unknown", ""))
	// The connection is alive and served.
	r.send(subscribeFrame(wire.KindSubscribe, "/pub", "a.*"))
	waitFor(t, "the SUBSCRIBE", func() bool { return l.Stats().Subscriptions == 1 })
	publish(t, p, "a.b", []byte("alive"))
	if d, payload := r.nextData(); d.Topic != "a.b" || string(payload) != "alive" {
		t.Fatalf("received %+v %q", d, payload)
	}
	if st := l.Stats(); st.StreamsRefused != 4 || st.ProtocolViolations != 0 {
		t.Errorf("stats %+v", st)
	}
}

// TestSubscriptionLimit: the 257th distinct filter closes the connection
// with LIMIT_EXCEEDED; re-subscribing held filters does not count.
func TestSubscriptionLimit(t *testing.T) {
	l := listen(t, ListenConfig{})
	r := rawDial(t, l)
	r.hello()
	for i := range 256 {
		// Split over two paths: the limit is per connection.
		r.send(subscribeFrame(wire.KindSubscribe, []string{"/a", "/b"}[i%2], fmt.Sprint("f", i)))
	}
	waitFor(t, "256 subscriptions", func() bool { return l.Stats().Subscriptions == 256 })
	r.send(subscribeFrame(wire.KindSubscribe, "/a", "f0"))
	r.send(subscribeFrame(wire.KindSubscribe, "/b", "f1"))
	r.send(subscribeFrame(wire.KindSubscribe, "/b", "f257"))
	if ae := r.closed(); ae.ErrorCode != quic.ApplicationErrorCode(LimitExceeded) {
		t.Fatalf("closed with %v, want LIMIT_EXCEEDED", ae)
	}
	waitFor(t, "the subscriptions to go with the connection", func() bool { return l.Stats().Subscriptions == 0 })
}

// TestSubscriberRefusals: a subscriber refuses DATA for other paths with
// UNKNOWN_ENDPOINT and exchanges with ERROR, discards reset copies, and
// closes with NO_ERROR.
func TestSubscriberRefusals(t *testing.T) {
	srv := rawListen(t)
	type result struct {
		wrongPath, exchange quic.StreamErrorCode
		errFrame            []byte
		close               *quic.ApplicationError
	}
	done := make(chan result, 1)
	srv.start(func(qc *quic.Conn) {
		var res result
		sendUni(qc, helloFrame(hello(nil)))
		st := sendUniOpen(qc, dataFrame("/other", "t", []byte("x")))
		<-st.Context().Done()
		res.wrongPath = streamCode(st.Context())
		bs, err := qc.OpenStreamSync(qc.Context())
		if err == nil {
			_, _ = bs.Write(dataFrame("/p", "", nil))
			res.errFrame, _ = io.ReadAll(bs)
			<-bs.Context().Done()
			res.exchange = streamCode(bs.Context())
		}
		// A copy abandoned half way, then a whole one.
		if rs, err := qc.OpenUniStreamSync(qc.Context()); err == nil {
			_, _ = rs.Write(dataFrame("/p", "reset", []byte("partial")))
			rs.CancelWrite(quic.StreamErrorCode(Canceled))
		}
		sendUni(qc, dataFrame("/p", "whole", []byte("ok")))
		<-qc.Context().Done()
		res.close = appErr(qc)
		done <- res
	})
	s, err := Dial(testCtx(t), srv.url("/p"), DialConfig{InsecureSkipVerifyForTesting: true})
	if err != nil {
		t.Fatal(err)
	}
	if m := receive(t, s); m.Topic != "whole" || string(m.Payload) != "ok" {
		t.Fatalf("received %+v", m)
	}
	_ = s.Close()
	res := <-done
	if res.wrongPath != quic.StreamErrorCode(UnknownEndpoint) {
		t.Errorf("DATA for another path stopped with %d, want UNKNOWN_ENDPOINT", res.wrongPath)
	}
	if res.exchange != quic.StreamErrorCode(Unsupported) || !bytes.Equal(res.errFrame, []byte{0x57, 0x02, 0x03, 0xA1, 0x00, 0x03}) {
		t.Errorf("exchange answered %x and stopped with %d, want ERROR{3} and UNSUPPORTED", res.errFrame, res.exchange)
	}
	if res.close == nil || res.close.ErrorCode != quic.ApplicationErrorCode(NoError) || !res.close.Remote {
		t.Errorf("Close sent %v, want NO_ERROR", res.close)
	}
}
