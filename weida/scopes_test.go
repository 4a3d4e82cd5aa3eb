package weida

import (
	"crypto/tls"
	"errors"
	"strings"
	"testing"

	"github.com/quic-go/quic-go"

	"weida.dev/connector/weida/wire"
)

// rawDialAs is rawDial presenting c's certificate.
func rawDialAs(t *testing.T, l *Listener, c *testCert) *raw {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		t.Fatal(err)
	}
	conf := rawTLS()
	conf.Certificates = []tls.Certificate{pair}
	qc, err := quicDial(t, l, conf)
	if err != nil {
		t.Fatalf("raw dial: %v", err)
	}
	return &raw{t: t, qc: qc}
}

// scopedListener is a listener admitting the clients a, b and c, with a
// publisher at /p replaying plant.a.x and plant.b.y, where a may
// subscribe within plant.a.#, b to everything, and c (admitted by the
// allowlist, not listed in the scopes) to nothing.
func scopedListener(t *testing.T, logs *logBuffer) (l *Listener, p *Publisher, r *storeReplayer, a, b, c *testCert) {
	t.Helper()
	a, b, c = newCert(t, "a", nil), newCert(t, "b", nil), newCert(t, "c", nil)
	l = listen(t, ListenConfig{
		ClientFingerprints: []string{Fingerprint(a.cert), Fingerprint(b.cert), Fingerprint(c.cert)},
		Logger:             logs.logger(),
	})
	p = publisher(t, l, "/p")
	r = &storeReplayer{}
	p.SetReplayer(r)
	r.publish(t, p, "plant.a.x", "a.x=1")
	r.publish(t, p, "plant.b.y", "b.y=1")
	if err := l.SetScopes("/p", Scopes{Fingerprint(a.cert): {"plant.a.#"}, Fingerprint(b.cert): {"#"}}); err != nil {
		t.Fatal(err)
	}
	return l, p, r, a, b, c
}

// TestScopesRefuseSubscribe: a client scoped to plant.a.# gets
// STOP_SENDING(REJECTED) for plant.#, # and the empty filter, keeps its
// connection, is replayed and sent only what plant.a.# covers, and the
// refusals are counted and logged with its fingerprint.
func TestScopesRefuseSubscribe(t *testing.T) {
	var logs logBuffer
	l, p, r, a, _, _ := scopedListener(t, &logs)
	c := rawDialAs(t, l, a)
	c.hello()
	for _, f := range []string{"plant.#", "#", "", "plant.*.x"} {
		st := c.sendOpen(subscribeFrame(wire.KindSubscribe, "/p", f))
		if code := stopCode(t, st); code != quic.StreamErrorCode(Rejected) {
			t.Fatalf("SUBSCRIBE %q stopped with %d, want REJECTED (%d)", f, code, Rejected)
		}
	}
	// The connection lives: an admitted filter is served, replay included.
	c.send(subscribeFrame(wire.KindSubscribe, "/p", "plant.a.#"))
	d, payload := c.nextData()
	if d.Topic != "plant.a.x" || string(payload) != "a.x=1" || !d.Replay.Replayed {
		t.Fatalf("first copy %+v %q, want the replay of plant.a.x", d, payload)
	}
	if res := r.publish(t, p, "plant.b.y", "b.y=2"); res.Matched != 0 {
		t.Fatalf("plant.b.y reached %d subscriber(s)", res.Matched)
	}
	r.publish(t, p, "plant.a.z", "a.z=1")
	if d, payload := c.nextData(); d.Topic != "plant.a.z" || string(payload) != "a.z=1" {
		t.Fatalf("live copy %+v %q, want plant.a.z", d, payload)
	}
	st := l.Stats()
	fp := Fingerprint(a.cert)
	if sc := st.Scopes["/p"]; sc.NotCovered != 4 || sc.Clients[fp] != 4 || sc.Unlisted != 0 || sc.Revoked != 0 {
		t.Errorf("Scopes[/p] = %+v, want 4 not covered, all of %s", sc, fp)
	}
	if st.CopiesReplayed != 1 || st.Subscriptions != 1 {
		t.Errorf("CopiesReplayed = %d, Subscriptions = %d; want 1 and 1", st.CopiesReplayed, st.Subscriptions)
	}
	// Rate-limited: the first refusal is logged, the next three within
	// ScopeLogInterval are not.
	if got := strings.Count(logs.String(), "refused SUBSCRIBE outside the client's scopes"); got != 1 {
		t.Errorf("%d refusal lines, want 1:\n%s", got, logs.String())
	}
	if want := `filter=plant.# client=` + fp + ` reason=not-covered`; !strings.Contains(logs.String(), want) {
		t.Errorf("log lacks %q:\n%s", want, logs.String())
	}
}

// TestScopesSubscriber: the same through Subscriber, the connector's own
// client: it never sees the refusal (PROTOCOL §9.4: a one-way refusal need
// not be observed), and receives only what its admitted filter selects.
func TestScopesSubscriber(t *testing.T) {
	var logs logBuffer
	l, p, r, a, b, _ := scopedListener(t, &logs)
	sa := dial(t, l, "/p", DialConfig{CertFile: a.certFile, KeyFile: a.keyFile})
	sb := dial(t, l, "/p", DialConfig{CertFile: b.certFile, KeyFile: b.keyFile})
	// The refusal is one-way: Subscribe returns nil, or, when the stop
	// came before the stream was sent whole, ErrSubscriptionRefused.
	if err := sa.Subscribe(testCtx(t), "#"); err != nil && !errors.Is(err, ErrSubscriptionRefused) {
		t.Fatal(err)
	}
	waitFor(t, "the refusal", func() bool { return l.Stats().Scopes["/p"].NotCovered == 1 })
	subscribe(t, l, sa, 1, "plant.a.#")
	subscribe(t, l, sb, 2, "#")
	if m := receive(t, sa); m.Topic != "plant.a.x" {
		t.Fatalf("a was replayed %q", m.Topic)
	}
	got := map[string]bool{receive(t, sb).Topic: true, receive(t, sb).Topic: true}
	if !got["plant.a.x"] || !got["plant.b.y"] {
		t.Fatalf("b, scoped to #, was replayed %v", got)
	}
	if res := r.publish(t, p, "plant.b.y", "b.y=2"); res.Matched != 1 {
		t.Fatalf("plant.b.y matched %d, want b alone", res.Matched)
	}
	if m := receive(t, sb); m.Topic != "plant.b.y" {
		t.Fatalf("b received %q", m.Topic)
	}
	if st := l.Stats(); st.CopiesReplayed != 3 {
		t.Errorf("CopiesReplayed = %d, want 3", st.CopiesReplayed)
	}
}

// TestScopesUnlisted: a client the allowlist admits but the path's scopes
// do not list is refused every SUBSCRIBE; one the allowlist does not
// admit never gets past the handshake, as without scopes.
func TestScopesUnlisted(t *testing.T) {
	var logs logBuffer
	l, _, _, _, _, c := scopedListener(t, &logs)
	rc := rawDialAs(t, l, c)
	rc.hello()
	st := rc.sendOpen(subscribeFrame(wire.KindSubscribe, "/p", "plant.a.x"))
	if code := stopCode(t, st); code != quic.StreamErrorCode(Rejected) {
		t.Fatalf("SUBSCRIBE from an unlisted client stopped with %d, want REJECTED", code)
	}
	if sc := l.Stats().Scopes["/p"]; sc.Unlisted != 1 || len(sc.Clients) != 0 {
		t.Errorf("Scopes[/p] = %+v, want 1 unlisted and no per-client count", sc)
	}
	if !strings.Contains(logs.String(), "client="+Fingerprint(c.cert)+" reason=unlisted") {
		t.Errorf("log lacks the unlisted refusal:\n%s", logs.String())
	}
	// A path without scopes stays open to every admitted client.
	publisher(t, l, "/open")
	rc.send(subscribeFrame(wire.KindSubscribe, "/open", "#"))
	waitFor(t, "the open subscription", func() bool { return l.Stats().Subscriptions == 1 })

	stranger := newCert(t, "stranger", nil)
	if _, err := Dial(testCtx(t), pinnedURL(l, "/p"), DialConfig{CertFile: stranger.certFile, KeyFile: stranger.keyFile}); !errors.Is(err, ErrClientRefused) {
		t.Fatalf("Dial by a client outside the allowlist = %v, want ErrClientRefused", err)
	}
}

// TestScopesNarrowLive: SetScopes on a live connection drops the
// subscriptions the new scopes no longer cover, counts and logs them,
// keeps the connection and the covered ones, and refuses the dropped
// filter from then on; widening admits it again.
func TestScopesNarrowLive(t *testing.T) {
	var logs logBuffer
	l, p, r, a, _, _ := scopedListener(t, &logs)
	s := dial(t, l, "/p", DialConfig{CertFile: a.certFile, KeyFile: a.keyFile})
	subscribe(t, l, s, 2, "plant.a.#", "plant.a.x")
	for range 2 {
		receive(t, s) // the replays of plant.a.x, one per filter
	}
	fp := Fingerprint(a.cert)
	if err := l.SetScopes("/p", Scopes{fp: {"plant.a.x"}}); err != nil {
		t.Fatal(err)
	}
	st := l.Stats()
	if st.Subscriptions != 1 || st.Scopes["/p"].Revoked != 1 || st.Scopes["/p"].Clients[fp] != 1 || st.Connections != 1 {
		t.Fatalf("after narrowing: %d subscriptions, %d connections, scopes %+v", st.Subscriptions, st.Connections, st.Scopes["/p"])
	}
	if !strings.Contains(logs.String(), `filter=plant.a.# client=`+fp+` reason=revoked`) {
		t.Errorf("log lacks the revocation:\n%s", logs.String())
	}
	if res := r.publish(t, p, "plant.a.z", "z"); res.Matched != 0 {
		t.Fatalf("plant.a.z still matched %d after the scope narrowed", res.Matched)
	}
	r.publish(t, p, "plant.a.x", "x=2")
	if m := receive(t, s); m.Topic != "plant.a.x" || string(m.Payload) != "x=2" {
		t.Fatalf("received %q %q, want the live plant.a.x", m.Topic, m.Payload)
	}
	// Widened again, the client may subscribe within plant.a.# again.
	if err := l.SetScopes("/p", Scopes{fp: {"plant.a.#"}}); err != nil {
		t.Fatal(err)
	}
	subscribe(t, l, s, 2, "plant.a.*")
	// nil lifts the restriction.
	if err := l.SetScopes("/p", nil); err != nil {
		t.Fatal(err)
	}
	subscribe(t, l, s, 3, "#")
	if sc := l.Stats().Scopes["/p"]; sc.NotCovered != 0 || sc.Revoked != 1 {
		t.Errorf("Scopes[/p] = %+v", sc)
	}
}

// TestSetScopesValidates: nothing changes when anything is invalid, and
// every fault is named.
func TestSetScopesValidates(t *testing.T) {
	l := listen(t, ListenConfig{})
	good := "sha256:" + strings.Repeat("ab", 32)
	err := l.SetScopes("/p", Scopes{"sha256:XYZ": {"a"}, good: {"a.#.b", "ok.*"}})
	if err == nil || !strings.Contains(err.Error(), "sha256:XYZ") || !strings.Contains(err.Error(), "a.#.b") {
		t.Fatalf("SetScopes = %v, want both faults", err)
	}
	if err := l.SetScopes("no-slash", nil); err == nil {
		t.Error("SetScopes accepted an invalid path")
	}
	// Nothing was set: an anonymous client may subscribe to /p.
	publisher(t, l, "/p")
	s := dial(t, l, "/p", DialConfig{})
	subscribe(t, l, s, 1, "#")
	_ = l.Close()
	if err := l.SetScopes("/p", nil); !errors.Is(err, ErrClosed) {
		t.Errorf("SetScopes after Close = %v, want ErrClosed", err)
	}
}
