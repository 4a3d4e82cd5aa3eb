package weidacli

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"io"
	"math/big"
	"net"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/internal/cli"
	"weida.dev/connector/weida"
)

// runCLI runs Main to its end with stdin and returns what it printed.
func runCLI(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = Main(context.Background(), args, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

// syncBuffer is a bytes.Buffer safe for the concurrent writes of a
// command's goroutines (slog handlers write from the listener's).
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// cliProc is one Main() in a goroutine, with stdin a pipe and stdout read
// line by line as it is written.
type cliProc struct {
	t      *testing.T
	cancel context.CancelFunc
	stdin  *io.PipeWriter
	lines  chan string
	stdout []string // the lines read so far
	stderr *syncBuffer
	code   chan int
}

// guard bounds every wait of these tests, so that a bug fails them instead
// of hanging; it is not a timing assertion.
const guard = 30 * time.Second

func startCLI(t *testing.T, args ...string) *cliProc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	p := &cliProc{t: t, cancel: cancel, stdin: inW, lines: make(chan string, 1000), stderr: &syncBuffer{}, code: make(chan int, 1)}
	go func() {
		sc := bufio.NewScanner(outR)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	go func() {
		code := Main(ctx, args, inR, outW, p.stderr)
		_ = outW.Close()
		_ = inR.Close()
		p.code <- code
	}()
	t.Cleanup(func() {
		cancel()
		_ = inW.Close()
	})
	return p
}

// waitLine reads stdout until a line matches re and returns its
// submatches.
func (p *cliProc) waitLine(re string) []string {
	p.t.Helper()
	rx := regexp.MustCompile(re)
	timeout := time.After(guard)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				p.t.Fatalf("stdout ended without a line matching %q; stdout %q, stderr %q", re, p.stdout, p.stderr)
			}
			p.stdout = append(p.stdout, l)
			if m := rx.FindStringSubmatch(l); m != nil {
				return m
			}
		case <-timeout:
			p.t.Fatalf("no line matching %q; stdout %q, stderr %q", re, p.stdout, p.stderr)
		}
	}
}

// wait returns the exit status and every stdout line.
func (p *cliProc) wait() (int, []string) {
	p.t.Helper()
	select {
	case code := <-p.code:
		for l := range p.lines {
			p.stdout = append(p.stdout, l)
		}
		return code, p.stdout
	case <-time.After(guard):
		p.t.Fatalf("command did not end; stdout %q, stderr %q", p.stdout, p.stderr)
		return 0, nil
	}
}

func (p *cliProc) write(s string) {
	p.t.Helper()
	if _, err := io.WriteString(p.stdin, s); err != nil {
		p.t.Fatalf("writing stdin: %v", err)
	}
}

// startPub starts `connector weida pub` on a free loopback port and
// returns it with the URL its banner suggests for the first path.
func startPub(t *testing.T, args ...string) (*cliProc, string) {
	t.Helper()
	p := startCLI(t, append([]string{"pub", "--listen", "127.0.0.1:0"}, args...)...)
	m := p.waitLine(`^  connector weida sub '(weida://sha256:[0-9a-f]{64}@127\.0\.0\.1:[0-9]+/[^']*)' --filter ''$`)
	return p, m[1]
}

func TestWeidaHelp(t *testing.T) {
	for _, args := range [][]string{
		{"--help"}, {"help"},
		{"sub", "--help"}, {"pub", "--help"}, {"bench", "--help"},
		{"sub", "weida://h:1/p", "--help"}, // after a positional argument too
	} {
		code, out, errOut := runCLI(t, "", args...)
		if code != cli.ExitOK || !strings.Contains(out, "usage: connector weida") || errOut != "" {
			t.Errorf("%v: code %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
	// The two-shell example of the README tour is in the help.
	_, out, _ := runCLI(t, "", "--help")
	for _, want := range []string{"connector weida pub --listen 127.0.0.1:4433 --path /sensors --wait-subscribers 1",
		"connector weida sub 'weida://sha256:", "--filter 'sensors.*.temp'"} {
		if !strings.Contains(out, want) {
			t.Errorf("weida --help lacks %q", want)
		}
	}
	for _, args := range [][]string{{}, {"bogus"}, {"sub", "--bogus"}} {
		if code, _, errOut := runCLI(t, "", args...); code != cli.ExitUsage || !strings.Contains(errOut, "usage") {
			t.Errorf("%v: code %d, stderr %q", args, code, errOut)
		}
	}
}

const testFP = "sha256:0000000000000000000000000000000000000000000000000000000000000000"

// TestWeidaSubUsage: every refusal happens before dialling (a dial of the
// unused port 1 would fail with status 1, not 2) and names what is wrong.
func TestWeidaSubUsage(t *testing.T) {
	pinned := "weida://" + testFP + "@127.0.0.1:1/p"
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"no URL", []string{"--filter", "a"}, []string{"missing the publisher's URL"}},
		{"URL twice", []string{pinned, pinned, "--filter", "a"}, []string{"repeats address 1", "one endpoint"}},
		{"URL and an argument", []string{pinned, "a", "--filter", "a"}, []string{`unexpected argument "a"`}},
		{"URLs of two paths", []string{pinned, "weida://" + testFP + "@127.0.0.1:2/q", "--filter", "a"}, []string{`names the path "/q"`, "one endpoint"}},
		{"URLs with two pins", []string{pinned, "weida://127.0.0.1:2/p", "--filter", "a"}, []string{"pins no fingerprint", "one endpoint"}},
		{"bad scheme", []string{"http://h:1/p", "--filter", "a"}, []string{`"http://h:1/p"`, "weida://"}},
		{"no port", []string{"weida://" + testFP + "@h/p", "--filter", "a"}, []string{"invalid URL"}},
		{"bad pin", []string{"weida://sha256:abc@h:1/p", "--filter", "a"}, []string{"invalid URL"}},
		{"star inside", []string{pinned, "--filter", "ok.#", "--filter", "a.b*"},
			[]string{`--filter "a.b*"`, `segment 2 ("b*")`, "star-not-alone"}},
		{"hash not final", []string{pinned, "--filter", "#.a"}, []string{`"#.a"`, "hash-not-final"}},
		{"hash inside", []string{pinned, "--filter", "a#"}, []string{"hash-not-alone"}},
		{"not UTF-8", []string{pinned, "--filter", "a.\xff"}, []string{"invalid-utf8"}},
		{"too long", []string{pinned, "--filter", strings.Repeat("a", 257)}, []string{"too-long", "256 bytes"}},
		{"no filter", []string{pinned}, []string{"--filter ''"}},
		{"bad output", []string{pinned, "--filter", "a", "--output", "yaml"}, []string{"--output"}},
		{"negative count", []string{pinned, "--filter", "a", "--count", "-1"}, []string{"--count"}},
		{"cert without key", []string{pinned, "--filter", "a", "--cert", "c.pem"}, []string{"--cert and --key"}},
		{"no trust", []string{"weida://127.0.0.1:1/p", "--filter", "a"}, []string{"pins no fingerprint", "--ca"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, "", append([]string{"sub"}, tc.args...)...)
			if code != cli.ExitUsage || out != "" {
				t.Fatalf("code %d, stdout %q, stderr %q", code, out, errOut)
			}
			for _, w := range tc.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("stderr %q lacks %q", errOut, w)
				}
			}
		})
	}
}

func TestWeidaPubUsage(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no path", nil, "no --path"},
		{"relative path", []string{"--path", "p"}, `--path "p"`},
		{"path twice", []string{"--path", "/p", "--path", "/p"}, "twice"},
		{"bad allow", []string{"--path", "/p", "--allow", "sha256:xyz"}, `--allow "sha256:xyz"`},
		{"cert without key", []string{"--path", "/p", "--key", "k.pem"}, "--cert and --key"},
		{"negative wait", []string{"--path", "/p", "--wait-subscribers", "-1"}, "--wait-subscribers"},
		{"zero drain", []string{"--path", "/p", "--drain", "0s"}, "--drain"},
		{"positional", []string{"--path", "/p", "extra"}, `unexpected argument "extra"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, "", append([]string{"pub", "--listen", "127.0.0.1:0"}, tc.args...)...)
			if code != cli.ExitUsage || out != "" || !strings.Contains(errOut, tc.want) {
				t.Errorf("code %d, stdout %q, stderr %q; want %q", code, out, errOut, tc.want)
			}
		})
	}
	// A listen failure is not a usage error.
	code, _, errOut := runCLI(t, "", "pub", "--listen", "256.0.0.1:0", "--path", "/p")
	if code != cli.ExitFailure || errOut == "" {
		t.Errorf("unusable --listen: code %d, stderr %q", code, errOut)
	}
}

// TestWeidaPubSub runs pub and two subs in-process over loopback: JSON and
// TSV input, a binary payload, metadata, an invalid line and a line for a
// path that is not hosted, text and JSON output.
func TestWeidaPubSub(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	pub, url := startPub(t, "--path", "/sensors", "--path", "/other", "--wait-subscribers", "2")

	text := startCLI(t, "sub", url, "--filter", "sensors.*.temp", "--count", "3")
	js := startCLI(t, "sub", "--output", "json", url, "--filter", "", "--count", "4")

	// Lines that must not reach the text subscriber come first, so that a
	// wrong match would take the place of a right one.
	pub.write("sensors.a.b.temp\tdeep\n")
	pub.write("not a message\n")
	pub.write(`{"topic":"sensors.x.temp","endpoint":"/missing"}` + "\n")
	pub.write("\n")
	pub.write("sensors.kitchen.temp\t21.5\twith a tab\r\n")
	pub.write(`{"topic":"sensors.hall.temp","payload":"19.0 <ok> & done","contentType":"text/plain","traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}` + "\n")
	pub.write(`{"topic":"sensors.bin.temp","payloadBase64":"AAEC/w=="}` + "\n")

	code, out := text.wait()
	if code != cli.ExitOK {
		t.Fatalf("text sub: code %d, stderr %q", code, text.stderr)
	}
	slices.Sort(out)
	want := []string{
		"sensors.bin.temp\tbase64:AAEC/w==",
		"sensors.hall.temp\t19.0 <ok> & done\tcontent-type=text/plain\ttraceparent=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		`sensors.kitchen.temp	"21.5\twith a tab"`, // not printable: the tab would split the field
	}
	if !slices.Equal(out, want) {
		t.Errorf("text sub printed\n%q\nwant\n%q", out, want)
	}
	if !strings.Contains(text.stderr.String(), `subscribed to "sensors.*.temp"`) {
		t.Errorf("text sub stderr %q", text.stderr)
	}

	code, out = js.wait()
	if code != cli.ExitOK {
		t.Fatalf("json sub: code %d, stderr %q", code, js.stderr)
	}
	got := map[string]subJSON{}
	for _, l := range out {
		var j subJSON
		if err := json.Unmarshal([]byte(l), &j); err != nil {
			t.Fatalf("json sub line %q: %v", l, err)
		}
		if j.Endpoint != "/sensors" {
			t.Errorf("line %q: endpoint %q", l, j.Endpoint)
		}
		got[j.Topic] = j
	}
	str := func(s string) *string { return &s }
	for topic, w := range map[string]subJSON{
		"sensors.a.b.temp":     {Payload: str("deep")},
		"sensors.kitchen.temp": {Payload: str("21.5\twith a tab")},
		"sensors.hall.temp":    {Payload: str("19.0 <ok> & done"), ContentType: "text/plain", Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		"sensors.bin.temp":     {PayloadBase64: str("AAEC/w==")},
	} {
		g, ok := got[topic]
		w.Endpoint, w.Topic = "/sensors", topic
		if !ok || !equalSubJSON(g, w) {
			t.Errorf("json sub: %s = %+v, want %+v", topic, g, w)
		}
	}
	if js := strings.Join(out, "\n"); !strings.Contains(js, "<ok> & done") {
		t.Errorf("json output escapes HTML characters: %s", js)
	}

	_ = pub.stdin.Close()
	code, out = pub.wait()
	if code != cli.ExitOK {
		t.Fatalf("pub: code %d, stderr %q", code, pub.stderr)
	}
	for _, w := range []string{
		"line 1: sensors.a.b.temp: matched 1, queued 1, dropped 0",
		"line 5: sensors.kitchen.temp: matched 2, queued 2, dropped 0",
		"line 6: sensors.hall.temp: matched 2, queued 2, dropped 0",
		"line 7: sensors.bin.temp: matched 2, queued 2, dropped 0",
		"published 4 messages: matched 7, queued 7, dropped 0; 7 copies written to QUIC; 2 invalid lines",
	} {
		if !slices.Contains(out, w) {
			t.Errorf("pub stdout lacks %q:\n%s", w, strings.Join(out, "\n"))
		}
	}
	for _, w := range []string{
		"waiting for 2 subscribers", "2 subscribers present",
		`line 2: neither a JSON object nor "topic<TAB>payload"; skipped`,
		`line 3: endpoint "/missing" is not hosted here (hosted: --path /other, --path /sensors); skipped`,
	} {
		if !strings.Contains(pub.stderr.String(), w) {
			t.Errorf("pub stderr lacks %q:\n%s", w, pub.stderr)
		}
	}
}

func equalSubJSON(a, b subJSON) bool {
	eq := func(x, y *string) bool { return (x == nil) == (y == nil) && (x == nil || *x == *y) }
	return a.Endpoint == b.Endpoint && a.Topic == b.Topic && a.ContentType == b.ContentType &&
		a.Traceparent == b.Traceparent && a.Tracestate == b.Tracestate &&
		eq(a.Payload, b.Payload) && eq(a.PayloadBase64, b.PayloadBase64)
}

// TestWeidaSubEnds: a sub reports the end of its connection, naming the
// close code, and an interrupt ends it with 0 without --count and 1 before
// --count messages.
func TestWeidaSubEnds(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	pub, url := startPub(t, "--path", "/p", "--wait-subscribers", "3", "--quiet")
	lost := startCLI(t, "sub", url, "--filter", "")
	untilCount := startCLI(t, "sub", url, "--filter", "", "--count", "5")
	forever := startCLI(t, "sub", url, "--filter", "a.#")
	pub.write("a\tone\n")
	for _, s := range []*cliProc{lost, untilCount, forever} {
		s.waitLine("^a\tone$")
	}

	untilCount.cancel()
	if code, _ := untilCount.wait(); code != cli.ExitFailure || !strings.Contains(untilCount.stderr.String(), "interrupted after 1 of 5 messages") {
		t.Errorf("interrupted before --count: code %d, stderr %q", code, untilCount.stderr)
	}
	forever.cancel()
	if code, _ := forever.wait(); code != cli.ExitOK {
		t.Errorf("interrupted without --count: code %d, stderr %q", code, forever.stderr)
	}

	_ = pub.stdin.Close() // pub drains and closes its listener: SHUTDOWN
	if code, out := pub.wait(); code != cli.ExitOK || !slices.Contains(out, "published 1 message: matched 3, queued 3, dropped 0; 3 copies written to QUIC") {
		t.Errorf("pub: code %d, stdout %q, stderr %q", code, out, pub.stderr)
	}
	code, _ := lost.wait()
	if errOut := lost.stderr.String(); code != cli.ExitFailure || !strings.Contains(errOut, "ended after 1 message") || !strings.Contains(errOut, "SHUTDOWN") {
		t.Errorf("lost connection: code %d, stderr %q", code, errOut)
	}
}

// TestWeidaPubUnconfirmed: a subscriber vanishes without closing (its
// packets stop at a relay); pub's summary counts the copies written to it
// as unconfirmed once the endpoint noticed, which the lines published
// meanwhile show by matching nobody.
func TestWeidaPubUnconfirmed(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	pub, url := startPub(t, "--path", "/p", "--wait-subscribers", "1")
	at := strings.Index(url, "@") + 1
	slash := at + strings.Index(url[at:], "/")
	relay := brokertest.NewUDPRelay(t, url[at:slash])
	defer relay.Close()
	s, err := weida.Dial(context.Background(), url[:at]+relay.Addr()+url[slash:], weida.DialConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Subscribe(context.Background(), ""); err != nil {
		t.Fatal(err)
	}
	pub.write("a\tone\n")
	pub.waitLine("^line 1: a: matched 1, queued 1")
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	if m, err := s.Receive(ctx); err != nil || string(m.Payload) != "one" {
		t.Fatalf("Receive: %q, %v", m.Payload, err)
	}

	relay.Cut()
	// Each line is written to the vanished subscriber until the endpoint
	// gives up on it (its idle timeout) and the next matches nobody.
	for line := 2; ; line++ {
		pub.write("a\tafter\n")
		if m := pub.waitLine(`^line \d+: a: matched (\d+)`); m[1] == "0" {
			break
		}
		if line > 1000 {
			t.Fatal("the vanished subscriber was never noticed")
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = pub.stdin.Close()
	code, out := pub.wait()
	summary := out[len(out)-1]
	m := regexp.MustCompile(`copies written to QUIC, (\d+) of them unconfirmed \(their subscriber vanished\)$`).FindStringSubmatch(summary)
	if code != cli.ExitOK || m == nil || m[1] == "0" {
		t.Errorf("pub: code %d, summary %q, stderr %q", code, summary, pub.stderr)
	}
}

// TestWeidaPubStrict: --strict stops at the first invalid line with status
// 1 after publishing the lines before it; without subscribers nothing is
// matched.
func TestWeidaPubStrict(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	code, out, errOut := runCLI(t, "a.b\tx\n{\"topic\":\"a\",\"bogus\":1}\nc\td\n",
		"pub", "--listen", "127.0.0.1:0", "--path", "/p", "--strict")
	if code != cli.ExitFailure || !strings.Contains(errOut, `line 2: JSON: json: unknown field "bogus"`) {
		t.Errorf("code %d, stderr %q", code, errOut)
	}
	if !strings.Contains(out, "line 1: a.b: matched 0, queued 0, dropped 0") || strings.Contains(out, "line 3") ||
		!strings.Contains(out, "published 1 message: matched 0, queued 0, dropped 0; 0 copies written to QUIC; 1 invalid line") {
		t.Errorf("stdout %q", out)
	}

	// --quiet: the banner and the summary only.
	code, out, _ = runCLI(t, "a\tx\nb\ty\n", "pub", "--listen", "127.0.0.1:0", "--path", "/p", "--quiet")
	if code != cli.ExitOK || strings.Contains(out, "line ") || !strings.Contains(out, "published 2 messages") {
		t.Errorf("--quiet: code %d, stdout %q", code, out)
	}
}

// TestWeidaPubInterrupted: interrupted while waiting for subscribers, pub
// fails; interrupted while reading stdin, it ends normally.
func TestWeidaPubInterrupted(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	p, _ := startPub(t, "--path", "/p", "--wait-subscribers", "1")
	p.cancel()
	if code, _ := p.wait(); code != cli.ExitFailure || !strings.Contains(p.stderr.String(), "interrupted while waiting for subscribers") {
		t.Errorf("code %d, stderr %q", code, p.stderr)
	}
	_ = p.stdin.Close()

	p, _ = startPub(t, "--path", "/p")
	p.write("a\tb\n")
	p.waitLine("^line 1: a: matched 0")
	p.cancel()
	if code, out := p.wait(); code != cli.ExitOK || !slices.Contains(out, "published 1 message: matched 0, queued 0, dropped 0; 0 copies written to QUIC") {
		t.Errorf("code %d, stdout %q, stderr %q", code, out, p.stderr)
	}
	_ = p.stdin.Close() // ends the goroutine reading it
}

func TestWeidaBenchCommand(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	code, out, errOut := runCLI(t, "", "bench", "--messages", "100", "--rounds", "2", "--subscribers", "1,3", "--window", "16", "--output", "json")
	if code != cli.ExitOK {
		t.Fatalf("code %d, stderr %q", code, errOut)
	}
	var rep benchJSON
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(rep.Series) != 3 || rep.Series[0].Name != "raw quic-go" || rep.Series[2].Receivers != 3 ||
		len(rep.Ratios) != 2 || rep.Ratio == nil || rep.GoalMet == nil || rep.Messages != 100 || rep.DurationSeconds != 0 {
		t.Errorf("report %s", out)
	}
	for _, s := range rep.Series {
		if len(s.Samples) != 2 || s.Samples[0].Copies != 100*int64(s.Receivers) || s.CopiesPerSecond <= 0 {
			t.Errorf("series %+v", s)
		}
	}
	if strings.Count(errOut, "round ") != 6 {
		t.Errorf("progress %q", errOut)
	}

	code, out, errOut = runCLI(t, "", "bench", "--messages", "50", "--rounds", "1", "--subscribers", "2", "--quiet")
	if code != cli.ExitOK || errOut != "" || !strings.Contains(out, "weida, 2 subscribers") || !strings.Contains(out, "no ratio: add 1") {
		t.Errorf("text: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, _ = runCLI(t, "", "bench", "--messages", "50", "--rounds", "1", "--subscribers", "1", "--quiet")
	if code != cli.ExitOK || !regexp.MustCompile(`(?m)^raw quic-go +[0-9,]+ +[0-9,]+ +[0-9.]+µs`).MatchString(out) ||
		!regexp.MustCompile(`goal: at least 85% of raw quic-go's rate: (met|NOT met)`).MatchString(out) {
		t.Errorf("text: code %d, stdout %q", code, out)
	}
}

func TestWeidaBenchUsage(t *testing.T) {
	for _, args := range [][]string{
		{"--subscribers", "0"}, {"--subscribers", "1,1"}, {"--subscribers", "a"}, {"--subscribers", ""},
		{"--rounds", "0"}, {"--size", "0"}, {"--window", "0"}, {"--duration", "0s"},
		{"--messages", "-1"}, {"--window", "100000"}, {"--output", "xml"}, {"extra"},
	} {
		if code, out, errOut := runCLI(t, "", append([]string{"bench"}, args...)...); code != cli.ExitUsage || out != "" || errOut == "" {
			t.Errorf("%v: code %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
}

// TestWeidaAllow: a pub with --allow admits a sub presenting the listed
// client certificate and refuses one without it, which fails with status 1
// and says why.
func TestWeidaAllow(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	certFile, keyFile, fp := writeTestClientCert(t)
	pub, url := startPub(t, "--path", "/p", "--allow", fp, "--wait-subscribers", "1")

	code, _, errOut := runCLI(t, "", "sub", url, "--filter", "")
	if code != cli.ExitFailure || !strings.Contains(errOut, "refused the client certificate") || !strings.Contains(errOut, "--cert and --key") {
		t.Errorf("sub without a certificate: code %d, stderr %q", code, errOut)
	}

	sub := startCLI(t, "sub", url, "--filter", "", "--cert", certFile, "--key", keyFile, "--count", "1")
	pub.write("a\tadmitted\n")
	if code, out := sub.wait(); code != cli.ExitOK || !slices.Equal(out, []string{"a\tadmitted"}) {
		t.Errorf("sub with the listed certificate: code %d, stdout %q, stderr %q", code, out, sub.stderr)
	}
	_ = pub.stdin.Close()
	if code, _ := pub.wait(); code != cli.ExitOK {
		t.Errorf("pub: code %d, stderr %q", code, pub.stderr)
	}
}

// writeTestClientCert writes a self-signed certificate for 127.0.0.1, fit
// for a client and a server, and its key, and returns the files and the
// certificate's weida fingerprint.
func writeTestClientCert(t *testing.T) (certFile, keyFile, fingerprint string) {
	t.Helper()
	c := brokertest.WriteCert(t, t.TempDir(), "client", &x509.Certificate{
		SerialNumber: big.NewInt(7),
		Subject:      pkix.Name{CommonName: "weida cli test client"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}, nil)
	return c.CertFile, c.KeyFile, weida.Fingerprint(c.Cert)
}

// TestWeidaCAFile: pub serves a certificate from files, and sub trusts it
// through --ca with a URL that pins nothing.
func TestWeidaCAFile(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	certFile, keyFile, fp := writeTestClientCert(t)
	pub, url := startPub(t, "--path", "/p", "--cert", certFile, "--key", keyFile, "--wait-subscribers", "1")
	if !strings.Contains(url, fp) {
		t.Fatalf("banner URL %q does not pin the certificate's fingerprint %s", url, fp)
	}
	unpinned := strings.Replace(url, fp+"@", "", 1)
	sub := startCLI(t, "sub", unpinned, "--ca", certFile, "--filter", "a", "--count", "1")
	pub.write("a\tvia CA\n")
	if code, out := sub.wait(); code != cli.ExitOK || !slices.Equal(out, []string{"a\tvia CA"}) {
		t.Errorf("sub: code %d, stdout %q, stderr %q", code, out, sub.stderr)
	}
	_ = pub.stdin.Close()
	if code, _ := pub.wait(); code != cli.ExitOK {
		t.Errorf("pub: code %d, stderr %q", code, pub.stderr)
	}
}

// TestWeidaSubDrainsOnInterrupt: interrupted right after its publisher
// queued copies for it, sub still prints every one of them (it leaves
// with Subscriber.Shutdown) and exits 0.
func TestWeidaSubDrainsOnInterrupt(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	l, err := weida.Listen(ctx, "127.0.0.1:0", weida.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p, err := l.Publisher("/drain")
	if err != nil {
		t.Fatal(err)
	}
	url := "weida://" + l.Fingerprint() + "@" + l.Addr().String() + "/drain"
	sub := startCLI(t, "sub", url, "--filter", "")
	for deadline := time.Now().Add(guard); l.Stats().Subscriptions == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("sub did not subscribe; stderr %q", sub.stderr)
		}
	}
	queued := 0
	for i := range 200 {
		res, err := p.Publish(ctx, weida.Message{Topic: "n", Payload: []byte(strings.Repeat("x", i))})
		if err != nil {
			t.Fatal(err)
		}
		queued += res.Queued
	}
	sub.cancel() // SIGINT
	code, out := sub.wait()
	if code != cli.ExitOK {
		t.Fatalf("sub: code %d, stderr %q", code, sub.stderr)
	}
	if len(out) != queued {
		t.Fatalf("sub printed %d of the %d messages queued for it before the interrupt; stderr %q", len(out), queued, sub.stderr)
	}
}

// TestLostAfterQueue: pub's summary counts as dropped the queued copies
// that were neither written nor refused by the time the listener shut
// down.
func TestLostAfterQueue(t *testing.T) {
	for _, c := range []struct {
		st   weida.ListenerStats
		want uint64
	}{
		{weida.ListenerStats{CopiesQueued: 10, CopiesWritten: 10}, 0},
		{weida.ListenerStats{CopiesQueued: 10, CopiesWritten: 4, CopiesRefused: 1}, 5},
		{weida.ListenerStats{CopiesQueued: 3, CopiesWritten: 5}, 0}, // replayed copies are written but not queued
	} {
		if got := lostAfterQueue(c.st); got != c.want {
			t.Errorf("lostAfterQueue(%+v) = %d, want %d", c.st, got, c.want)
		}
	}
}

// TestWeidaSubFailover: sub is given the addresses of two publishers of one
// path; the first ends, and sub dials the second, subscribes again and
// prints what it publishes. The second starts only once sub has
// subscribed at the first, as a standby that takes over would, so which
// address answers first does not depend on the machine's load.
func TestWeidaSubFailover(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	unpinned := func(url string) string { return regexp.MustCompile(`sha256:[0-9a-f]{64}@`).ReplaceAllString(url, "") }
	first, urlA := startPub(t, "--path", "/p", "--wait-subscribers", "1", "--quiet")
	urlA = unpinned(urlA)
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	addrB := udp.LocalAddr().String()
	_ = udp.Close() // free for the second publisher, which binds it below
	urlB := "weida://" + addrB + "/p"
	sub := startCLI(t, "sub", urlA, urlB, "--filter", "", "--insecure-skip-verify-for-testing")
	first.write("a\tone\n") // read once sub has subscribed
	sub.waitLine("^a\tone$")

	second := startCLI(t, "pub", "--listen", addrB, "--path", "/p", "--wait-subscribers", "1", "--quiet")
	second.waitLine(`^  connector weida sub '`)
	_ = first.stdin.Close() // the first publisher drains and leaves
	if code, _ := first.wait(); code != cli.ExitOK {
		t.Fatalf("first pub: code %d, stderr %q", code, first.stderr)
	}
	second.write("a\ttwo\n") // read once sub has subscribed again
	sub.waitLine("^a\ttwo$")
	_ = second.stdin.Close()
	if code, _ := second.wait(); code != cli.ExitOK {
		t.Errorf("second pub: code %d, stderr %q", code, second.stderr)
	}

	sub.cancel()
	code, _ := sub.wait()
	errOut := sub.stderr.String()
	for _, want := range []string{
		`subscribed to "" on ` + urlA,
		"connection to " + urlA + " lost after 1 message",
		"messages published meanwhile are lost",
		`subscribed to "" on ` + urlB,
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr %q lacks %q", errOut, want)
		}
	}
	if code != cli.ExitOK {
		t.Errorf("sub: code %d, stderr %q", code, errOut)
	}
}
