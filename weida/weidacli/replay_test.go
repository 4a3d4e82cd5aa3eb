package weidacli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"weida.dev/connector/weida"
)

// fixedReplayer replays the same messages to every subscription.
type fixedReplayer []weida.Message

func (r fixedReplayer) Replay(_ string, yield func(weida.Message) bool) {
	for _, m := range r {
		if !yield(m) {
			return
		}
	}
}

// TestWeidaSubShowsReplayMarks: sub prints a replayed copy's marks, in
// text and in JSON, and pub accepts sub's JSON lines with them.
func TestWeidaSubShowsReplayMarks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := weida.Listen(ctx, "127.0.0.1:0", weida.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p, err := l.Publisher("/lv")
	if err != nil {
		t.Fatal(err)
	}
	p.SetReplayer(fixedReplayer{
		{Topic: "a.fresh", Payload: []byte("1"), Replay: weida.Replay{Age: 1500 * time.Millisecond, HasAge: true}},
		{Topic: "a.old", Payload: []byte("2"), Replay: weida.Replay{Age: time.Minute, HasAge: true, Stale: true}},
	})
	url := fmt.Sprintf("weida://%s@%s/lv", l.Fingerprint(), l.Addr())

	code, out, errOut := runCLI(t, "", "sub", url, "--filter", "a.*", "--count", "2")
	if code != 0 {
		t.Fatalf("sub exited %d: %s", code, errOut)
	}
	for _, want := range []string{"a.fresh\t1\treplayed=true\tage=1.5s\n", "a.old\t2\treplayed=true\tage=1m0s\tstale=true\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("sub printed %q, want a line %q", out, want)
		}
	}

	code, out, errOut = runCLI(t, "", "sub", url, "--filter", "a.old", "--count", "1", "--output", "json")
	if code != 0 {
		t.Fatalf("sub --output json exited %d: %s", code, errOut)
	}
	var j subJSON
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		t.Fatalf("%q: %v", out, err)
	}
	if !j.Replayed || !j.Stale || j.AgeMs == nil || *j.AgeMs != 60000 {
		t.Fatalf("JSON marks %+v in %q", j, out)
	}
	if _, _, err := parsePubLine([]byte(strings.TrimSpace(out))); err != nil {
		t.Fatalf("pub refuses sub's JSON line %q: %v", out, err)
	}
	// A live copy prints no marks.
	if got := string(writeSubText(nil, &weida.Message{Topic: "t", Payload: []byte("x")})); got != "t\tx\n" {
		t.Fatalf("a live copy prints %q", got)
	}
}
