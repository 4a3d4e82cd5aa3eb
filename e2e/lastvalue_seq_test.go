package e2e

import (
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// TestNATSLastValueSequences: against a real JetStream stream, every copy
// a weida subscriber receives carries the stream sequence of its message
// (DATA key 68), replayed and live alike: the replayed copies' sequences
// are below every live one, and a subscriber that selects part of the
// stream sees the gaps the other subjects leave. The endpoint advertises
// its replay in its HELLO.
func TestNATSLastValueSequences(t *testing.T) {
	requireTCP(t, "nats-server", natsAddr)
	u := unique()
	nc := natsConn(t, natsAddr)
	js := createStream(t, nc, "LVS"+u, u+".>")
	stored := map[string]uint64{} // subject -> sequence of its last message
	pub := func(subject, payload string) uint64 {
		t.Helper()
		ack, err := js.Publish(ctx(t, 5*time.Second), u+"."+subject, []byte(payload))
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	for _, p := range [][2]string{{"a", "1"}, {"b", "1"}, {"a", "2"}, {"c", "1"}, {"a", "3"}, {"b", "2"}} {
		stored[u+"."+p[0]] = pub(p[0], p[1])
	}
	if _, err := js.CreateConsumer(ctx(t, 5*time.Second), "LVS"+u, jetstream.ConsumerConfig{
		Durable: "lv", AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverNewPolicy, FilterSubject: u + ".>",
	}); err != nil {
		t.Fatal(err)
	}
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/js", freePort(t, "udp"))
	res := natsResource{
		Name: "nats-lvs", Direction: policy.Inbound, Endpoint: endpoint,
		Stream: "LVS" + u, Durable: "lv", Routes: []string{u + ".*"},
		LastValue: "mode: retained",
	}
	c := StartConnector(t, nil, "-f", writeFile(t, t.TempDir(), "lvs.yaml", res.YAML(t)))
	c.WaitReady(30 * time.Second)
	Eventually(t, 20*time.Second, "the last values seeded", func() bool {
		st, _ := c.Status("nats-lvs")
		return st.Counters.LastValue != nil && st.Counters.LastValue.Entries == 3
	})

	// The HELLO says the path replays, version 1.
	dctx := ctx(t, 10*time.Second)
	probe, err := weida.Dial(dctx, endpoint, weida.DialConfig{InsecureSkipVerifyForTesting: true})
	if err != nil {
		t.Fatal(err)
	}
	ad, ok := probe.PeerReplays()
	_ = probe.Close()
	if !ok || ad.Version != 1 || !slices.Equal(ad.Paths, []string{"/js"}) {
		t.Fatalf("PeerReplays = %+v, %v; want version 1 listing /js", ad, ok)
	}

	all := collectWeida(t, endpoint, weida.Limits{}, u+".#")
	onlyA := collectWeida(t, endpoint, weida.Limits{}, u+".a")
	Eventually(t, 20*time.Second, "the replays", func() bool { return all.Len() >= 3 && onlyA.Len() >= 1 })
	// Live traffic, interleaved over subjects; each subscriber is known to
	// hold its subscription (its replay arrived), so each gets its copies.
	var live []uint64
	for _, s := range []string{"b", "a", "c", "b", "a"} {
		live = append(live, pub(s, "live"))
	}
	Eventually(t, 20*time.Second, "the live copies", func() bool { return all.Len() >= 8 && onlyA.Len() >= 3 })

	var replaySeqs, liveSeqs []uint64
	for _, m := range all.Messages() {
		if m.SourceSequence == 0 {
			t.Fatalf("a copy of %s carries no source sequence", m.Topic)
		}
		if string(m.Payload) == "live" {
			liveSeqs = append(liveSeqs, m.SourceSequence)
			continue
		}
		if m.SourceSequence != stored[m.Topic] {
			t.Errorf("replayed %s has sequence %d, the stream stores it at %d", m.Topic, m.SourceSequence, stored[m.Topic])
		}
		replaySeqs = append(replaySeqs, m.SourceSequence)
	}
	slices.Sort(liveSeqs)
	if !slices.Equal(liveSeqs, live) {
		t.Errorf("live sequences %v, want the stream's %v", liveSeqs, live)
	}
	if len(replaySeqs) != 3 || slices.Max(replaySeqs) >= slices.Min(liveSeqs) {
		t.Errorf("replayed sequences %v are not all below the live ones %v", replaySeqs, liveSeqs)
	}

	// The subscriber of one subject sees the others as gaps.
	var aSeqs []uint64
	for _, m := range onlyA.Messages() {
		aSeqs = append(aSeqs, m.SourceSequence)
	}
	slices.Sort(aSeqs)
	want := []uint64{stored[u+".a"], live[1], live[4]}
	if !slices.Equal(aSeqs, want) {
		t.Fatalf("%s.a sequences %v, want %v", u, aSeqs, want)
	}
	if aSeqs[2]-aSeqs[1] < 2 || aSeqs[1]-aSeqs[0] < 2 {
		t.Fatalf("no gap visible in %v", aSeqs)
	}
	t.Logf("replayed %v, live %v, one subject %v", replaySeqs, liveSeqs, aSeqs)

	// connector weida sub shows both: the advertisement on stderr, each
	// copy's source sequence on stdout.
	cctx := ctx(t, 30*time.Second)
	cmd := exec.CommandContext(cctx, connectorBin, "weida", "sub", endpoint, "--filter", u+".c", "--count", "1",
		"--insecure-skip-verify-for-testing")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("connector weida sub: %v\n%s", err, stderr.String())
	}
	// The copy is the replay of the topic's last value, so it also
	// carries the replay marks (its age varies).
	if want := fmt.Sprintf("%s.c\tlive\tsource-seq=%d\treplayed=true\tage=", u, live[2]); !strings.HasPrefix(stdout.String(), want) {
		t.Errorf("connector weida sub printed %q, want it to start %q", stdout.String(), want)
	}
	if want := "the publisher replays last values on /js (last-value extension version 1)"; !strings.Contains(stderr.String(), want) {
		t.Errorf("connector weida sub stderr %q lacks %q", stderr.String(), want)
	}
}
