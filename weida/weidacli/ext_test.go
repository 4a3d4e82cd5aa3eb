package weidacli

import (
	"context"
	"strings"
	"testing"

	"weida.dev/connector/internal/cli"
	"weida.dev/connector/weida"
)

type oneReplay struct{ m weida.Message }

func (r *oneReplay) Replay(_ string, yield func(weida.Message) bool) { yield(r.m) }

func TestWeidaSubShowsReplayAndSourceSequence(t *testing.T) {
	l, err := weida.Listen(context.Background(), "127.0.0.1:0", weida.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p, err := l.Publisher("/state")
	if err != nil {
		t.Fatal(err)
	}
	p.SetReplayer(&oneReplay{weida.Message{Topic: "room.a", SourceSequence: 12, Payload: []byte("cached")}})
	url := "weida://" + l.Fingerprint() + "@" + l.Addr().String() + "/state"

	for _, c := range []struct{ output, line string }{
		{"text", "room.a\tcached\tsource-seq=12\treplayed=true\n"},
		{"json", `"sourceSequence":12`},
	} {
		code, out, errs := runCLI(t, "", "sub", url, "--filter", "#", "--count", "1", "--output", c.output)
		if code != cli.ExitOK {
			t.Fatalf("%s: code %d, stderr %q", c.output, code, errs)
		}
		if !strings.Contains(out, c.line) {
			t.Errorf("%s: stdout %q, want %q", c.output, out, c.line)
		}
		if want := "the publisher replays last values on /state (last-value extension version 1)"; !strings.Contains(errs, want) {
			t.Errorf("%s: stderr %q, want %q", c.output, errs, want)
		}
	}
}

func TestWriteSubTextSourceSequence(t *testing.T) {
	m := weida.Message{Topic: "a", Payload: []byte("x"), SourceSequence: 3}
	if got, want := string(writeSubText(nil, &m)), "a\tx\tsource-seq=3\n"; got != want {
		t.Fatalf("writeSubText = %q, want %q", got, want)
	}
}
