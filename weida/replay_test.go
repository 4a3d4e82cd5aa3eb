package weida

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"weida.dev/connector/weida/topic"
)

// storeReplayer is a last-value cache for tests: PublishWith records into
// it, and it replays what a filter selects.
type storeReplayer struct {
	s topic.Store[[]byte]
}

func (r *storeReplayer) Replay(filter string, yield func(Message) bool) {
	r.s.MatchFilter(filter, func(tp string, p []byte) bool {
		return yield(Message{Topic: tp, Payload: p})
	})
}

func (r *storeReplayer) publish(t *testing.T, p *Publisher, tp, payload string) Result {
	t.Helper()
	res, err := p.PublishWith(testCtx(t), Message{Topic: tp, Payload: []byte(payload)}, func() {
		r.s.Set(tp, []byte(payload))
	})
	if err != nil {
		t.Fatalf("PublishWith(%q): %v", tp, err)
	}
	return res
}

func TestReplayThenLive(t *testing.T) {
	l := listen(t, ListenConfig{})
	p := publisher(t, l, "/state")
	var r storeReplayer
	p.SetReplayer(&r)
	for _, tp := range []string{"room.a.temp", "room.b.temp", "room.a.hum"} {
		if res := r.publish(t, p, tp, tp+"=1"); res.Matched != 0 {
			t.Fatalf("nobody is subscribed, yet %+v", res)
		}
	}
	r.publish(t, p, "room.a.temp", "room.a.temp=2") // the last value wins

	s := dial(t, l, "/state", DialConfig{})
	subscribe(t, l, s, 1, "room.*.temp")
	got := []string{string(receive(t, s).Payload), string(receive(t, s).Payload)}
	slices.Sort(got)
	if want := []string{"room.a.temp=2", "room.b.temp=1"}; !slices.Equal(got, want) {
		t.Fatalf("replay = %q, want %q", got, want)
	}
	if res := r.publish(t, p, "room.b.temp", "room.b.temp=3"); res.Queued != 1 {
		t.Fatalf("live publish after the replay = %+v", res)
	}
	if m := receive(t, s); string(m.Payload) != "room.b.temp=3" {
		t.Fatalf("live copy = %q", m.Payload)
	}
	if st := l.Stats(); st.CopiesReplayed != 2 {
		t.Fatalf("CopiesReplayed = %d, want 2", st.CopiesReplayed)
	}

	// A filter matching nothing cached replays nothing; a repeated
	// SUBSCRIBE replays nothing again.
	s2 := dial(t, l, "/state", DialConfig{})
	subscribe(t, l, s2, 2, "other.#")
	subscribe(t, l, s, 2, "room.*.temp")
	r.publish(t, p, "other.x", "other.x=1")
	if m := receive(t, s2); string(m.Payload) != "other.x=1" {
		t.Fatalf("a subscriber whose filter matched nothing cached got %q first", m.Payload)
	}
	if st := l.Stats(); st.CopiesReplayed != 2 {
		t.Fatalf("CopiesReplayed = %d after replays of nothing, want 2", st.CopiesReplayed)
	}

	// After Close, a new publisher of the path replays nothing until it
	// sets a Replayer of its own.
	p.Close()
	p2 := publisher(t, l, "/state")
	s3 := dial(t, l, "/state", DialConfig{})
	subscribe(t, l, s3, 3, "room.#")
	if _, err := p2.Publish(testCtx(t), Message{Topic: "room.z", Payload: []byte("live")}); err != nil {
		t.Fatal(err)
	}
	if m := receive(t, s3); string(m.Payload) != "live" {
		t.Fatalf("the replayer of a closed publisher replayed %q", m.Payload)
	}
}

// TestReplayRacesLive subscribes while topics are published without pause
// and checks the guarantee of PublishWith: per topic, the subscriber gets
// the value current at its SUBSCRIBE by replay and every later one live,
// each exactly once.
func TestReplayRacesLive(t *testing.T) {
	const topics, rounds = 8, 300
	l := listen(t, ListenConfig{})
	p := publisher(t, l, "/race")
	var r storeReplayer
	p.SetReplayer(&r)
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range rounds {
			for k := range topics {
				tp := fmt.Sprintf("t.%d", k)
				v := strconv.Itoa(i)
				if _, err := p.PublishWith(ctx, Message{Topic: tp, Payload: []byte(v)}, func() { r.s.Set(tp, []byte(v)) }); err != nil {
					return
				}
			}
			if i == 10 {
				// Let the subscriber in while publishing goes on.
				for l.Stats().Subscriptions == 0 && ctx.Err() == nil {
					time.Sleep(time.Millisecond)
				}
			}
		}
	})
	s := dial(t, l, "/race", DialConfig{})
	waitFor(t, "a few rounds", func() bool { _, ok := r.s.Get("t.0"); return ok })
	if err := s.Subscribe(testCtx(t), "t.*"); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	// Every copy goes to the one subscriber: receive them all, in
	// whatever order the streams arrive.
	st := l.Stats()
	got := make(map[string][]int)
	for range st.CopiesQueued + st.CopiesReplayed {
		m := receive(t, s)
		v, _ := strconv.Atoi(string(m.Payload))
		got[m.Topic] = append(got[m.Topic], v)
	}
	if len(got) != topics {
		t.Fatalf("received %d topics, want %d", len(got), topics)
	}
	for tp, vs := range got {
		slices.Sort(vs)
		first := vs[0]
		if vs[len(vs)-1] != rounds-1 {
			t.Fatalf("%s: received %v: the last value is missing", tp, vs)
		}
		for i, v := range vs {
			if v != first+i {
				t.Fatalf("%s: received %v: a value is missing or repeated", tp, vs)
			}
		}
	}
	if st := l.Stats(); st.CopiesReplayed != topics || st.Dropped.Total() != 0 {
		t.Fatalf("stats %+v: want %d replayed copies, no drop", st, topics)
	}
}
