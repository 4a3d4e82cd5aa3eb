package weidacli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"time"

	"weida.dev/connector/internal/cli"
	"weida.dev/connector/weida"
	"weida.dev/connector/weida/address"
	"weida.dev/connector/weida/topic"
)

const pubSynopsis = `connector weida pub --path P [--path Q...] [--listen ADDR] [--cert FILE --key FILE]
           [--allow sha256:<hex>...] [--max-connections N] [--max-connections-per-address N]
           [--wait-subscribers N] [--quiet] [--strict]

Hosts a weida publisher endpoint: binds ADDR (UDP), registers each --path,
prints the endpoint's fingerprint and a ready-to-paste 'connector weida sub'
command line per path, then publishes every line read from stdin and
reports what it reached ("line 3: a.b: matched 2, queued 2, dropped 0").
The summary at the end counts as dropped also the copies that were queued
and then lost, their connection closing before they were written.

A line is either a JSON object
  {"topic": "a.b", "payload": "text", "contentType": "...", "traceparent": "...",
   "tracestate": "...", "endpoint": "/path"}
where payload may also be any other JSON value (published as its JSON text),
or be replaced by "payloadBase64" for binary payloads, and only topic is
required; or the topic, a TAB and the payload, taken literally up to the end
of the line. The --output json lines of 'connector weida sub' are valid
input. A line goes to its "endpoint" (which must be one of the --path
values), else to the first --path. Blank lines are ignored. An invalid line is
reported with its number on stderr and skipped, or, with --strict, ends the
command with status 1.

Without --cert and --key a self-signed certificate is generated; subscribers
pin its fingerprint, printed first. With --allow, only clients presenting a
certificate with a listed fingerprint may subscribe.

At the end of input it waits up to --drain for queued copies to be handed to
QUIC, then --linger for them to cross the network (weida v0 has no
acknowledgement: bytes still in flight when the endpoint closes are lost),
and exits 0. The summary counts the copies written to subscribers that
vanished without closing (killed, cut off) as unconfirmed: they may or may
not have arrived. Interrupting it does the same. Exit status: 0 at the end of
input or when interrupted while publishing; 1 when it cannot listen, with
--strict on an invalid line, or when interrupted while waiting for
subscribers; 2 on a usage error.`

// maxPubLine bounds one stdin line: the default subscriber budget (8 MiB)
// in base64 inside JSON, with room to spare.
const maxPubLine = 16 << 20

func cmdPub(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("weida pub", pubSynopsis, stderr)
	var paths, allow cli.StringList
	fs.Var(&paths, "path", "a publisher path to host, starting with '/'; repeatable")
	listen := fs.String("listen", "127.0.0.1:4433", "UDP address to bind, host:port (port 0 picks a free one)")
	certFile := fs.String("cert", "", "certificate chain (PEM); without it a self-signed certificate is generated")
	keyFile := fs.String("key", "", "the certificate's private key (PEM)")
	fs.Var(&allow, "allow", "admit only clients presenting a certificate with this fingerprint (sha256:<hex>); repeatable")
	maxConns := fs.Int("max-connections", 0, "connections the endpoint serves at once; 0 means weida's default (1024)")
	maxPerAddr := fs.Int("max-connections-per-address", 0, "connections one client address (an IPv6 /64) may hold, unless --allow lists its certificate; 0 means weida's default (64)")
	wait := fs.Int("wait-subscribers", 0, "before reading stdin, wait until this many subscriber connections hold a subscription")
	quiet := fs.Bool("quiet", false, "print only a summary at the end, not a report per line")
	strict := fs.Bool("strict", false, "stop at the first invalid line, with status 1")
	drain := fs.Duration("drain", 5*time.Second, "at the end, how long to wait for queued copies to be handed to QUIC")
	linger := fs.Duration("linger", 250*time.Millisecond, "then how long to keep connections open for bytes in flight")
	pos, code, done := parseInterspersed(fs, args, stdout)
	if done {
		return code
	}
	bad := func(format string, a ...any) int { return usageError(stderr, "pub", format, a...) }
	switch {
	case len(pos) > 0:
		return bad("unexpected argument %q", pos[0])
	case len(paths) == 0:
		return bad("no --path given; host at least one, e.g. --path /sensors")
	case (*certFile == "") != (*keyFile == ""):
		return bad("--cert and --key go together")
	case *wait < 0:
		return bad("--wait-subscribers must be 0 or more, not %d", *wait)
	case *maxConns < 0 || *maxPerAddr < 0:
		return bad("--max-connections and --max-connections-per-address must be 0 (the default) or more")
	case *drain <= 0 || *linger < 0:
		return bad("--drain must be positive and --linger not negative")
	}
	seen := map[string]bool{}
	for _, p := range paths {
		if err := address.ValidatePath(p); err != nil {
			return bad("--path %q: %v", p, err)
		}
		if seen[p] {
			return bad("--path %q given twice", p)
		}
		seen[p] = true
	}
	for _, fp := range allow {
		if err := address.ValidateFingerprint(fp); err != nil {
			return bad("--allow %q: %v", fp, err)
		}
	}

	l, err := weida.Listen(ctx, *listen, weida.ListenConfig{
		CertFile: *certFile, KeyFile: *keyFile, ClientFingerprints: allow,
		Limits: weida.Limits{MaxConnections: *maxConns, MaxConnectionsPerAddress: *maxPerAddr},
		Logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		fmt.Fprintf(stderr, "connector weida pub: %v\n", err)
		return cli.ExitFailure
	}
	defer l.Close()
	pubs := make(map[string]*weida.Publisher, len(paths))
	for _, p := range paths {
		if pubs[p], err = l.Publisher(p); err != nil {
			fmt.Fprintf(stderr, "connector weida pub: %v\n", err)
			return cli.ExitFailure
		}
	}
	writePubBanner(stdout, l, paths)

	pp := &pubRun{l: l, pubs: pubs, first: paths[0], quiet: *quiet, stdout: stdout, stderr: stderr}
	if *wait > 0 && !pp.waitSubscribers(ctx, *wait) {
		fmt.Fprintln(stderr, "connector weida pub: interrupted while waiting for subscribers")
		return cli.ExitFailure
	}
	code = pp.publishLines(ctx, stdin, *strict)
	pp.finish(ctx, *drain, *linger)
	return code
}

// writePubBanner prints the endpoint's identity and, per path, the
// command that subscribes to it.
func writePubBanner(w io.Writer, l *weida.Listener, paths []string) {
	ua := l.Addr().(*net.UDPAddr)
	host := ua.IP.String()
	note := ""
	if ua.IP.IsUnspecified() {
		// Bound to every interface: suggest loopback, which works here.
		host = "127.0.0.1"
		if ua.IP.To4() == nil {
			host = "::1"
		}
		note = " (from another machine, use an address of this one)"
	}
	fmt.Fprintf(w, "listening on %s, fingerprint %s\n", ua, l.Fingerprint())
	fmt.Fprintf(w, "subscribe with%s:\n", note)
	for _, p := range paths {
		u := address.Address{Fingerprint: l.Fingerprint(), Host: host, Port: ua.Port, Path: p}
		fmt.Fprintf(w, "  connector weida sub %s --filter ''\n", shellQuote(u.String()))
	}
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// pubRun is the state of one pub command after listening.
type pubRun struct {
	l              *weida.Listener
	pubs           map[string]*weida.Publisher
	first          string
	quiet          bool
	stdout, stderr io.Writer

	published, invalid       int
	matched, queued, dropped int
}

// waitSubscribers waits until n connections hold a subscription on the
// hosted paths; false when ctx ended first.
func (pp *pubRun) waitSubscribers(ctx context.Context, n int) bool {
	fmt.Fprintf(pp.stderr, "connector weida pub: waiting for %s\n", countOf(n, "subscriber", "subscribers"))
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		have := 0
		for _, p := range pp.pubs {
			have += p.Subscribers()
		}
		if have >= n {
			fmt.Fprintf(pp.stderr, "connector weida pub: %s present\n", countOf(have, "subscriber", "subscribers"))
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
}

// publishLines publishes every line of r until its end or ctx's, and
// returns the exit status.
func (pp *pubRun) publishLines(ctx context.Context, r io.Reader, strict bool) int {
	lines := make(chan inputLine)
	stop := make(chan struct{})
	defer close(stop) // the reader may stay blocked in r.Read until r ends
	go readLines(r, maxPubLine, lines, stop)
	for {
		var in inputLine
		select {
		case <-ctx.Done():
			return cli.ExitOK
		case in = <-lines:
		}
		switch {
		case in.eof:
			return cli.ExitOK
		case in.err != nil:
			fmt.Fprintf(pp.stderr, "connector weida pub: reading stdin: %v\n", in.err)
			return cli.ExitFailure
		}
		err := pp.publishLine(ctx, in)
		if err == nil {
			continue
		}
		if ctx.Err() != nil {
			return cli.ExitOK
		}
		pp.invalid++
		if strict {
			fmt.Fprintf(pp.stderr, "connector weida pub: line %d: %v\n", in.n, err)
			return cli.ExitFailure
		}
		fmt.Fprintf(pp.stderr, "connector weida pub: line %d: %v; skipped\n", in.n, err)
	}
}

// errBlank marks a line with nothing on it; such lines are not published
// and not reported.
var errBlank = errors.New("blank line")

func (pp *pubRun) publishLine(ctx context.Context, in inputLine) error {
	if in.tooLong {
		return fmt.Errorf("longer than %d bytes", maxPubLine)
	}
	path, msg, err := parsePubLine(in.text)
	if errors.Is(err, errBlank) {
		return nil
	}
	if err != nil {
		return err
	}
	if path == "" {
		path = pp.first
	}
	p, ok := pp.pubs[path]
	if !ok {
		return fmt.Errorf("endpoint %q is not hosted here (hosted: --path %s)", path, strings.Join(slices.Sorted(maps.Keys(pp.pubs)), ", --path "))
	}
	res, err := p.Publish(ctx, msg)
	if err != nil {
		return err
	}
	pp.published++
	pp.matched += res.Matched
	pp.queued += res.Queued
	pp.dropped += res.Dropped
	if !pp.quiet {
		fmt.Fprintf(pp.stdout, "line %d: %s: matched %d, queued %d, dropped %d\n",
			in.n, safeText(msg.Topic), res.Matched, res.Queued, res.Dropped)
	}
	return nil
}

// finish waits for queued copies, lingers, shuts the listener down and
// prints the summary.
func (pp *pubRun) finish(ctx context.Context, drain, linger time.Duration) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), drain)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !pubDrained(pp.l.Stats()) && dctx.Err() == nil {
		select {
		case <-dctx.Done():
		case <-tick.C:
		}
	}
	if st := pp.l.Stats(); st.CopiesWritten > 0 && linger > 0 {
		select {
		case <-time.After(linger):
		case <-dctx.Done():
		}
	}
	if err := pp.l.Shutdown(dctx); err != nil {
		fmt.Fprintf(pp.stderr, "connector weida pub: copies still queued after --drain %v were dropped\n", drain)
	}
	st := pp.l.Stats()
	// Publish counts the copies it could not queue; a queued copy can
	// still be lost, when its connection closes before it is written
	// (the listener's Dropped.ConnectionClosed, among others). After
	// Shutdown every queued copy was written, refused by its
	// subscriber or lost, so the lost ones are what remains.
	lost := lostAfterQueue(st)
	fmt.Fprintf(pp.stdout, "published %s: matched %d, queued %d, dropped %d",
		countOf(pp.published, "message", "messages"), pp.matched, pp.queued, uint64(pp.dropped)+lost)
	if lost > 0 {
		fmt.Fprintf(pp.stdout, " (%d of them after queueing: their connection closed before they were written)", lost)
	}
	fmt.Fprintf(pp.stdout, "; %s written to QUIC", countOf(int(st.CopiesWritten), "copy", "copies"))
	if st.CopiesUnconfirmed > 0 {
		// Written to a subscriber that vanished without closing: the
		// copies it may or may not have received.
		fmt.Fprintf(pp.stdout, ", %d of them unconfirmed (their subscriber vanished)", st.CopiesUnconfirmed)
	}
	if pp.invalid > 0 {
		fmt.Fprintf(pp.stdout, "; %s", countOf(pp.invalid, "invalid line", "invalid lines"))
	}
	fmt.Fprintln(pp.stdout)
}

// lostAfterQueue is the number of queued copies neither written nor
// refused by their subscriber: once the listener is shut down, those its
// connections dropped.
func lostAfterQueue(st weida.ListenerStats) uint64 {
	done := st.CopiesWritten + st.CopiesRefused
	if done >= st.CopiesQueued {
		return 0
	}
	return st.CopiesQueued - done
}

// pubDrained reports whether every queued copy has been written, refused
// by its subscriber, or dropped with its connection.
func pubDrained(st weida.ListenerStats) bool {
	return st.CopiesWritten+st.CopiesRefused+st.Dropped.ConnectionClosed >= st.CopiesQueued
}

// pubJSON is a JSON input line: the --output json line of sub, with only
// topic required.
type pubJSON struct {
	Endpoint      *string         `json:"endpoint"`
	Topic         *string         `json:"topic"`
	ContentType   string          `json:"contentType"`
	Traceparent   string          `json:"traceparent"`
	Tracestate    string          `json:"tracestate"`
	Payload       json.RawMessage `json:"payload"`
	PayloadBase64 *string         `json:"payloadBase64"`
	// The replay marks sub prints are accepted, so that sub's output can
	// be published again, and ignored: what pub sends is live.
	Replayed bool    `json:"replayed"`
	AgeMs    *uint64 `json:"ageMs"`
	Stale    bool    `json:"stale"`
}

// parsePubLine reads one input line: a JSON object, or topic TAB payload.
// path is "" when the line names no endpoint. A blank line is errBlank.
func parsePubLine(line []byte) (path string, m weida.Message, err error) {
	trimmed := bytes.TrimLeft(line, " \t")
	switch {
	case len(bytes.TrimSpace(line)) == 0:
		return "", m, errBlank
	case trimmed[0] == '{':
		return parsePubJSON(trimmed)
	}
	tp, payload, ok := bytes.Cut(line, []byte{'\t'})
	if !ok {
		return "", m, errors.New(`neither a JSON object nor "topic<TAB>payload"`)
	}
	m.Topic, m.Payload = string(tp), payload
	if err := topic.ValidateTopic(m.Topic); err != nil {
		return "", m, fmt.Errorf("topic %s", explainFilterError(err))
	}
	return "", m, nil
}

func parsePubJSON(line []byte) (path string, m weida.Message, err error) {
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	var j pubJSON
	if err := dec.Decode(&j); err != nil {
		return "", m, fmt.Errorf("JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return "", m, errors.New("JSON: more than one value on the line")
	}
	if j.Topic == nil {
		return "", m, errors.New(`JSON: no "topic"`)
	}
	if err := topic.ValidateTopic(*j.Topic); err != nil {
		return "", m, fmt.Errorf("topic %s", explainFilterError(err))
	}
	m = weida.Message{Topic: *j.Topic, ContentType: j.ContentType, Traceparent: j.Traceparent, Tracestate: j.Tracestate}
	switch {
	case j.PayloadBase64 != nil && j.Payload != nil:
		return "", m, errors.New(`JSON: give "payload" or "payloadBase64", not both`)
	case j.PayloadBase64 != nil:
		if m.Payload, err = base64.StdEncoding.DecodeString(*j.PayloadBase64); err != nil {
			return "", m, fmt.Errorf(`JSON: "payloadBase64": %w`, err)
		}
	case len(j.Payload) > 0 && j.Payload[0] == '"':
		var s string
		if err := json.Unmarshal(j.Payload, &s); err != nil {
			return "", m, fmt.Errorf(`JSON: "payload": %w`, err)
		}
		m.Payload = []byte(s)
	case string(j.Payload) == "null":
		// an explicit null is an empty payload, like an absent one
	default:
		m.Payload = j.Payload // any other JSON value, as written
	}
	if j.Endpoint != nil {
		path = *j.Endpoint
		if path == "" {
			return "", m, errors.New(`JSON: "endpoint" is empty`)
		}
	}
	return path, m, nil
}

// inputLine is one line of stdin (without its line ending), or its end.
type inputLine struct {
	n       int    // line number, from 1
	text    []byte // owned by the receiver
	tooLong bool   // the line exceeded the limit; text is nil
	eof     bool   // no more lines
	err     error  // reading failed; no more lines
}

// readLines sends r's lines on out, then a final inputLine with eof or err
// set, and returns. It stops early when stop is closed; it may block in
// r.Read until r ends, which is why it runs apart from the command.
func readLines(r io.Reader, limit int, out chan<- inputLine, stop <-chan struct{}) {
	send := func(in inputLine) bool {
		select {
		case out <- in:
			return true
		case <-stop:
			return false
		}
	}
	br := bufio.NewReaderSize(r, 64<<10)
	for n := 1; ; n++ {
		var line []byte
		tooLong := false
		var err error
		for {
			var chunk []byte
			chunk, err = br.ReadSlice('\n')
			if !tooLong {
				if len(line)+len(chunk) > limit+2 { // the limit plus "\r\n"
					tooLong, line = true, nil
				} else {
					line = append(line, chunk...)
				}
			}
			if err != bufio.ErrBufferFull {
				break
			}
		}
		if len(line) > 0 || tooLong {
			line = bytes.TrimSuffix(line, []byte{'\n'})
			line = bytes.TrimSuffix(line, []byte{'\r'})
			if len(line) > limit {
				tooLong, line = true, nil
			}
			if !send(inputLine{n: n, text: line, tooLong: tooLong}) {
				return
			}
		}
		if err == io.EOF {
			send(inputLine{eof: true})
			return
		}
		if err != nil {
			send(inputLine{err: err})
			return
		}
	}
}

// countOf renders n with the singular or the plural noun.
func countOf(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
