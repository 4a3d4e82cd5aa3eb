package weida

import (
	"fmt"
	"testing"

	"github.com/quic-go/quic-go"

	"weida.dev/connector/weida/wire"
)

// A writer keeps its send turn while QUIC packetizes its copies, but not
// for longer than turnHold: more subscribers than there are turns whose
// flow-control credit is used up (they never read) would otherwise hold
// every turn for as long as they live, and a subscriber that reads would
// get nothing more.
func TestStalledWritersGiveTheirTurnsBack(t *testing.T) {
	l := listen(t, ListenConfig{})
	p := publisher(t, l, "/p")
	stalled := cap(l.turns) + 1
	for range stalled {
		// 4 KiB of connection credit, returned only as the streams are
		// read, which this client never does.
		qc, err := quicDialConfig(t, l, rawTLS(), &quic.Config{
			MaxIncomingUniStreams:          1000,
			InitialConnectionReceiveWindow: 4 << 10,
			MaxConnectionReceiveWindow:     4 << 10,
		})
		if err != nil {
			t.Fatalf("raw dial: %v", err)
		}
		r := &raw{t: t, qc: qc}
		r.hello()
		r.send(subscribeFrame(wire.KindSubscribe, "/p", "#"))
	}
	waitFor(t, "the stalled subscriptions", func() bool { return l.Stats().Subscriptions == int64(stalled) })
	reader := dial(t, l, "/p", DialConfig{})
	subscribe(t, l, reader, int64(stalled)+1, "#")

	// 1 KiB copies: by the fifth, every stalled writer waits for credit
	// that never comes, in the wait it keeps its turn through.
	payload := make([]byte, 1<<10)
	for i := range 40 {
		topic := fmt.Sprintf("m.%d", i)
		if r := publish(t, p, topic, payload); r.Matched != stalled+1 {
			t.Fatalf("publish %d matched %d, want %d", i, r.Matched, stalled+1)
		}
		if m := receive(t, reader); m.Topic != topic {
			t.Fatalf("reader received %q, want %q", m.Topic, topic)
		}
	}
	if n := l.Stats().Connections; n != stalled+1 {
		t.Fatalf("listener holds %d connections, want %d: the test relies on none being closed", n, stalled+1)
	}
}
