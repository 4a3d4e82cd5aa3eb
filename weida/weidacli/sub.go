package weidacli

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"weida.dev/connector/internal/cli"
	"weida.dev/connector/weida"
	"weida.dev/connector/weida/address"
	"weida.dev/connector/weida/topic"
	"weida.dev/connector/weida/wire"
)

const subSynopsis = `connector weida sub URL [URL...] --filter F [--filter G...] [--count N] [--output text|json]
           [--ca FILE] [--cert FILE --key FILE] [--drain-timeout D] [--insecure-skip-verify-for-testing]

Dials a weida publisher path, URL = weida://[sha256:<hex>@]host:port/path,
subscribes to every --filter and prints each message it receives, one per
line.

Several URLs are the addresses of one endpoint's replicas (the same path
and the same pin, or none, on each): they are dialled in turn, from the
first, until one answers (one that stays silent is joined by the next
after 250 ms), and when the connection is lost the next ones are dialled
again, for up to --dial-timeout, the filters subscribed again and printing
goes on; what the endpoint published in between is lost, and stderr says
so. With one URL a lost connection ends the command. The filters use weida's grammar: segments cut at '.', '*' matches one
segment, a final '#' matches any number, and '' matches every topic. Each is
checked before anything is dialled.

The publisher is trusted by the fingerprint pinned in the URL (connector
weida pub prints it), else by the CA file given with --ca.

Text output: topic, TAB, payload, then content-type=, traceparent=,
tracestate= and source-seq= (the source's sequence, DATA key 68) fields
(TAB-separated) when the message has them, and, for a copy the publisher
replayed from its last-value cache rather than published live,
replayed=true, age=<duration> (how long before the replay its source
delivered the value) and stale=true (the publisher's source was
disconnected at the replay). A payload is
shown as is when it is printable UTF-8; UTF-8 with tabs, newlines or other
control characters is shown quoted ("{\n  \"a\": 1\n}"); anything else as
"base64:" and its base64 encoding. A payload that itself starts with '"' or
"base64:" is quoted. A topic or field that is not printable is quoted.
JSON output: one object per line with endpoint, topic, contentType,
traceparent, tracestate, sourceSequence (when present) and either payload
(valid UTF-8) or payloadBase64; a replayed copy adds replayed, ageMs and
stale.

What the publisher's HELLO advertises (the last-value extension, key 64)
is said on stderr once subscribed.

Ends after --count messages (0: until interrupted). Interrupted (SIGINT,
SIGTERM), it unsubscribes and keeps printing the messages the publisher had
already sent until the publisher has been quiet briefly, for at most
--drain-timeout; whatever arrived and was not printed by then is reported
on stderr. Exit status: 0 after
--count messages or, with --count 0, when interrupted; 1 when the connection
fails or is lost (the message names the close code), or when interrupted
before --count messages; 2 on a usage error.`

// subJSON is one --output json line; pub reads the same shape.
type subJSON struct {
	Endpoint    string `json:"endpoint"`
	Topic       string `json:"topic"`
	ContentType string `json:"contentType"`
	Traceparent string `json:"traceparent"`
	Tracestate  string `json:"tracestate"`
	// SourceSequence is DATA key 68, the source's number for the message.
	SourceSequence uint64  `json:"sourceSequence,omitempty"`
	Payload        *string `json:"payload,omitempty"`
	PayloadBase64  *string `json:"payloadBase64,omitempty"`
	// The replay marks (DATA extension keys 65-67), on replayed copies.
	Replayed bool    `json:"replayed,omitempty"`
	AgeMs    *uint64 `json:"ageMs,omitempty"`
	Stale    bool    `json:"stale,omitempty"`
}

// subOptions are the flags and argument of connector weida sub.
type subOptions struct {
	url                   string          // the first URL
	addr                  address.Address // the first URL's
	urls                  []string        // every URL, the first included
	filters               cli.StringList
	count                 int
	output                string
	caFile, certFile      string
	keyFile               string
	insecure              bool
	dialTimeout, drainFor time.Duration
}

func cmdSub(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, code, done := parseSub(args, stdout, stderr)
	if done {
		return code
	}
	f, err := weida.NewFailover(o.urls, weida.DialConfig{
		CAFile: o.caFile, CertFile: o.certFile, KeyFile: o.keyFile,
		InsecureSkipVerifyForTesting: o.insecure,
		Logger:                       slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}, 0)
	if err != nil { // check accepted the URLs, so this cannot happen
		fmt.Fprintf(stderr, "connector weida sub: %v\n", err)
		return cli.ExitFailure
	}
	sub, ok := dialSub(ctx, o, f, stderr)
	if !ok {
		return cli.ExitFailure
	}
	n := 0
	for {
		code, lost := serveSub(ctx, sub, o, &n, stdout, stderr)
		if lost == nil {
			return code
		}
		// Another address may answer: the replica that held the endpoint
		// has gone, and another one takes over.
		fmt.Fprintf(stderr, "connector weida sub: connection to %s lost after %s: %v; dialling the endpoint's addresses again (messages published meanwhile are lost)\n",
			safeText(sub.URL()), countOf(n, "message", "messages"), lost)
		if sub, ok = dialSub(ctx, o, f, stderr); !ok {
			if ctx.Err() != nil && o.count == 0 {
				return cli.ExitOK // interrupted, as --count 0 is meant to end
			}
			return cli.ExitFailure
		}
	}
}

// serveSub subscribes sub to every filter and prints what it receives,
// counting in *n. It returns the exit status, or, when the connection was
// lost and the command has other addresses to dial, the loss.
func serveSub(ctx context.Context, sub *weida.Subscriber, o subOptions, n *int, stdout, stderr io.Writer) (int, error) {
	// An interrupt ends ctx; the subscriber then leaves with Shutdown, which
	// unsubscribes and lets the copies already sent arrive, while the loop
	// below keeps receiving (Receive does not watch ctx) until Shutdown
	// closes the connection.
	drained := make(chan error, 1)
	stopDrain := context.AfterFunc(ctx, func() {
		dctx, cancel := context.WithTimeout(context.Background(), o.drainFor)
		defer cancel()
		drained <- sub.Shutdown(dctx)
	})
	drainErr := sync.OnceValue(func() error { return <-drained })
	defer func() {
		_ = sub.Close()
		if !stopDrain() {
			drainErr()
		}
	}()
	for _, f := range o.filters {
		if err := sub.Subscribe(ctx, f); err != nil {
			if len(o.urls) > 1 && sub.Err() != nil && ctx.Err() == nil {
				return 0, err
			}
			fmt.Fprintf(stderr, "connector weida sub: subscribing to %s: %v\n", safeText(f), err)
			return cli.ExitFailure, nil
		}
	}
	fmt.Fprintf(stderr, "connector weida sub: subscribed to %s on %s\n", quotedList(o.filters), sub.URL())
	reportExtensions(sub, stderr)
	return receiveSub(ctx, sub, o, n, drainErr, stdout, stderr)
}

// reportExtensions says on stderr what the publisher's HELLO advertises:
// the last-value extension, and the number of any other extension key.
func reportExtensions(sub *weida.Subscriber, stderr io.Writer) {
	for _, e := range sub.PeerExtensions() {
		if e.Key != wire.HelloLastValue {
			fmt.Fprintf(stderr, "connector weida sub: the publisher's HELLO carries extension key %d, unknown here\n", e.Key)
		}
	}
	ad, covers := sub.PeerReplays()
	switch {
	case covers && ad.Paths == nil:
		fmt.Fprintf(stderr, "connector weida sub: the publisher advertises last-value replay (version %d) without listing its paths\n", ad.Version)
	case covers:
		fmt.Fprintf(stderr, "connector weida sub: the publisher replays last values on %s (last-value extension version %d)\n", sub.Path(), ad.Version)
	case ad.Version != 0:
		fmt.Fprintf(stderr, "connector weida sub: the publisher replays last values on other paths only (version %d)\n", ad.Version)
	}
}

// parseSub reads sub's flags and checks them, and every filter, before
// anything is dialled. done is true when the command ends here, with code.
func parseSub(args []string, stdout, stderr io.Writer) (o subOptions, code int, done bool) {
	fs := cli.NewFlagSet("weida sub", subSynopsis, stderr)
	fs.Var(&o.filters, "filter", "a weida filter to subscribe to; repeatable; '' matches every topic")
	fs.IntVar(&o.count, "count", 0, "exit after this many messages; 0 runs until interrupted")
	fs.StringVar(&o.output, "output", "text", "output format: text or json")
	fs.StringVar(&o.caFile, "ca", "", "PEM file of CA certificates that may vouch for the publisher (when the URL pins no fingerprint)")
	fs.StringVar(&o.certFile, "cert", "", "client certificate (PEM), for publishers that admit listed fingerprints only")
	fs.StringVar(&o.keyFile, "key", "", "the client certificate's private key (PEM)")
	fs.BoolVar(&o.insecure, "insecure-skip-verify-for-testing", false, "accept any publisher certificate; for tests only")
	fs.DurationVar(&o.dialTimeout, "dial-timeout", 10*time.Second, "how long connecting and the HELLO exchange may take")
	fs.DurationVar(&o.drainFor, "drain-timeout", 5*time.Second, "once interrupted, how long to keep printing what the publisher already sent; 0 stops at once")
	pos, code, done := parseInterspersed(fs, args, stdout)
	if done {
		return o, code, true
	}
	if msg := o.check(pos); msg != "" {
		return o, usageError(stderr, "sub", "%s", msg), true
	}
	return o, 0, false
}

// check validates the options and the positional arguments pos, and
// returns what is wrong ("" when nothing is). It fills o.url and o.addr.
func (o *subOptions) check(pos []string) string {
	extra := slices.IndexFunc(pos, func(p string) bool { return !strings.HasPrefix(p, "weida://") })
	switch {
	case len(pos) == 0:
		return "missing the publisher's URL (weida://[sha256:<hex>@]host:port/path)"
	case extra > 0:
		return fmt.Sprintf("unexpected argument %q: give the URLs of one endpoint, and each filter with --filter", pos[extra])
	case o.output != "text" && o.output != "json":
		return fmt.Sprintf("--output must be text or json, not %q", o.output)
	case o.count < 0:
		return fmt.Sprintf("--count must be 0 or more, not %d", o.count)
	case (o.certFile == "") != (o.keyFile == ""):
		return "--cert and --key go together"
	case o.dialTimeout <= 0:
		return "--dial-timeout must be positive"
	case o.drainFor < 0:
		return "--drain-timeout must be 0 or more"
	case len(o.filters) == 0:
		return "no --filter given; use --filter '' to receive every topic"
	}
	addrs := make([]address.Address, len(pos))
	for i, p := range pos {
		a, err := address.Parse(p)
		if err != nil {
			return err.Error()
		}
		addrs[i] = a
	}
	if errs := address.CheckReplicas(addrs, pos); len(errs) > 0 {
		return errs[0].Error() + ": give the addresses of one endpoint, each with the first URL's path and pin"
	}
	addr := addrs[0]
	o.url, o.addr, o.urls = pos[0], addr, pos
	for _, f := range o.filters {
		if err := topic.ValidateFilter(f); err != nil {
			return "--filter " + explainFilterError(err)
		}
	}
	if addr.Fingerprint == "" && o.caFile == "" && !o.insecure {
		return fmt.Sprintf("%s pins no fingerprint and no --ca is given: pin the publisher as weida://sha256:<hex>@%s%s (connector weida pub prints it)",
			o.url, addr.HostPort(), addr.Path)
	}
	return ""
}

// dialSub dials the publisher through f within --dial-timeout; when that
// fails it says why on stderr and returns false. With several addresses,
// a round in which none answers is followed by another, after a pause,
// until the timeout: during a failover the replica taking over may not
// listen yet.
func dialSub(ctx context.Context, o subOptions, f *weida.Failover, stderr io.Writer) (*weida.Subscriber, bool) {
	dctx, cancel := context.WithTimeout(ctx, o.dialTimeout)
	defer cancel()
	sub, err := f.Dial(dctx)
	for err != nil && len(o.urls) > 1 && dctx.Err() == nil && !settled(err) {
		select {
		case <-dctx.Done():
		case <-time.After(redialPause):
			sub, err = f.Dial(dctx)
		}
	}
	if err == nil {
		return sub, true
	}
	if dctx.Err() != nil && ctx.Err() == nil && !settled(err) {
		err = fmt.Errorf("%w (%w)", err, context.DeadlineExceeded)
	}
	var nerr net.Error
	switch {
	case ctx.Err() != nil:
		fmt.Fprintln(stderr, "connector weida sub: interrupted while connecting")
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &nerr) && nerr.Timeout():
		fmt.Fprintf(stderr, "connector weida sub: no weida publisher answered at %s (UDP): %v\n", hostPorts(o), err)
	default:
		fmt.Fprintf(stderr, "connector weida sub: %v\n", err)
		if hint := dialHint(err, o); hint != "" {
			fmt.Fprintln(stderr, "connector weida sub: "+hint)
		}
	}
	return nil, false
}

// dialHint says what to do about a failed dial, or "" when the error says
// it all. Only a refused client certificate earns the --cert hint: a
// publisher that refused the connection for one of its limits (issue 25:
// every slot taken by one host) admitted the client, and a certificate
// would change nothing.
func dialHint(err error, o subOptions) string {
	var ce *weida.CloseError
	switch {
	case errors.Is(err, weida.ErrClientRefused):
		if o.certFile == "" {
			return "the publisher admits listed clients only (pub --allow): give --cert and --key"
		}
		return "the publisher does not list this certificate's fingerprint: ask its operator to admit it"
	case !errors.As(err, &ce) || !ce.Remote || ce.Code != weida.LimitExceeded:
		return ""
	}
	switch ce.Reason {
	case weida.RefusedMaxConnections:
		return "the publisher serves as many connections as it allows (max_connections), from all its clients: try again later, or ask its operator to raise the limit (spec.weida.maxConnections)"
	case weida.RefusedMaxConnectionsPerAddr:
		return "this client's address (for IPv6, its /64) holds as many connections to the publisher as it allows (max_connections_per_address): close some, or ask its operator to raise the limit (spec.weida.maxConnectionsPerAddress) or to admit this client by certificate (allowedClients)"
	case weida.RefusedMaxConnectionsPerPeer:
		return "this client certificate holds as many connections to the publisher as it allows (max_connections_per_peer): close some of them"
	}
	return "the publisher refused the connection for one of its limits (" + ce.Reason + ")"
}

// receiveSub prints messages until --count, an interrupt (after the drain
// drainErr waits for) or the connection's end, and returns the exit status.
func receiveSub(ctx context.Context, sub *weida.Subscriber, o subOptions, np *int, drainErr func() error, stdout, stderr io.Writer) (int, error) {
	write := writeSubText
	if o.output == "json" {
		write = writeSubJSON
	}
	var buf []byte
	for ; o.count == 0 || *np < o.count; *np++ {
		n := *np
		m, err := sub.Receive(context.Background())
		if err != nil && ctx.Err() != nil {
			return interruptedSub(sub, o, n, drainErr(), stderr), nil
		}
		if err != nil && len(o.urls) > 1 {
			return 0, err
		}
		if err != nil {
			fmt.Fprintf(stderr, "connector weida sub: connection to %s ended after %s: %v\n", o.addr, countOf(n, "message", "messages"), err)
			return cli.ExitFailure, nil
		}
		buf = write(buf[:0], &m)
		if _, err := stdout.Write(buf); err != nil {
			fmt.Fprintf(stderr, "connector weida sub: writing output: %v\n", err)
			return cli.ExitFailure, nil
		}
	}
	return cli.ExitOK, nil
}

// settled reports whether a failed dial of several addresses would fail
// the same way again: every address failed for a reason that another try
// cannot change, so redialling until --dial-timeout would only replace the
// precise errors (and the --cert hint) with a timeout.
func settled(err error) bool {
	var fe *weida.FailoverError
	if !errors.As(err, &fe) {
		return permanent(err)
	}
	for _, e := range fe.Errs {
		if e == nil || !permanent(e) {
			return false
		}
	}
	return true
}

// permanent reports whether err, the failed dial of one address, is one
// that a replica taking over would repeat: the replicas present one
// certificate and admit the same clients, and this side's files do not
// change while it dials. Everything else (no answer, a refused port, a
// listener shutting down or full) may pass once a replica listens.
func permanent(err error) bool {
	var (
		pathErr   *fs.PathError
		authority x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
	)
	switch {
	case errors.Is(err, weida.ErrFingerprintMismatch),
		errors.Is(err, weida.ErrClientRefused),
		errors.Is(err, weida.ErrNoTrust),
		errors.As(err, &pathErr), // an unreadable --cert, --key or --ca
		errors.As(err, &authority), errors.As(err, &hostname), errors.As(err, &invalid):
		return true
	}
	return false
}

// redialPause separates two rounds of dialling every address of the
// endpoint, so that a command waiting for a replica to take over does not
// spin.
const redialPause = 200 * time.Millisecond

// hostPorts lists the host:port of every URL of o.
func hostPorts(o subOptions) string {
	hp := make([]string, len(o.urls))
	for i, u := range o.urls {
		a, _ := address.Parse(u)
		hp[i] = a.HostPort()
	}
	return strings.Join(hp, ", ")
}

// interruptedSub reports an interrupt after n messages, and what the
// drain (ended with drainErr) left unread, and returns the exit status.
func interruptedSub(sub *weida.Subscriber, o subOptions, n int, drainErr error, stderr io.Writer) int {
	if drainErr != nil {
		fmt.Fprintf(stderr, "connector weida sub: stopped at --drain-timeout %s, before the publisher had gone quiet; dropped unread: %s\n",
			o.drainFor, countOf(int(sub.Stats().DroppedUnread), "message", "messages"))
	}
	if o.count == 0 {
		return cli.ExitOK
	}
	fmt.Fprintf(stderr, "connector weida sub: interrupted after %d of %d messages\n", n, o.count)
	return cli.ExitFailure
}

// writeSubText appends one text line for m.
func writeSubText(b []byte, m *weida.Message) []byte {
	b = append(b, safeText(m.Topic)...)
	b = append(b, '\t')
	b = append(b, safePayload(m.Payload)...)
	for _, kv := range [...]struct{ k, v string }{
		{"content-type", m.ContentType},
		{"traceparent", m.Traceparent},
		{"tracestate", m.Tracestate},
	} {
		if kv.v != "" {
			b = append(b, '\t')
			b = append(b, kv.k...)
			b = append(b, '=')
			b = append(b, safeText(kv.v)...)
		}
	}
	if m.SourceSequence != 0 {
		b = append(b, "\tsource-seq="...)
		b = strconv.AppendUint(b, m.SourceSequence, 10)
	}
	if r := m.Replay; r.Replayed || r.Stale || r.HasAge {
		if r.Replayed {
			b = append(b, "\treplayed=true"...)
		}
		if r.HasAge {
			b = append(b, "\tage="...)
			b = append(b, r.Age.String()...)
		}
		if r.Stale {
			b = append(b, "\tstale=true"...)
		}
	}
	return append(b, '\n')
}

// writeSubJSON appends one JSON line for m.
func writeSubJSON(b []byte, m *weida.Message) []byte {
	j := subJSON{Endpoint: m.Endpoint, Topic: m.Topic, ContentType: m.ContentType,
		Traceparent: m.Traceparent, Tracestate: m.Tracestate, SourceSequence: m.SourceSequence,
		Replayed: m.Replay.Replayed, Stale: m.Replay.Stale}
	if m.Replay.HasAge {
		ms := uint64(m.Replay.Age / time.Millisecond)
		j.AgeMs = &ms
	}
	if utf8.Valid(m.Payload) {
		s := string(m.Payload)
		j.Payload = &s
	} else {
		s := base64.StdEncoding.EncodeToString(m.Payload)
		j.PayloadBase64 = &s
	}
	out, err := marshalJSONLine(j)
	if err != nil { // unreachable: every field is a string
		return append(b, fmt.Sprintf("{\"error\":%q}\n", err)...)
	}
	return append(b, out...)
}

// marshalJSONLine encodes v on one line without escaping <, > and &,
// which are common in payloads and harmless outside HTML.
func marshalJSONLine(v any) ([]byte, error) {
	var w lineBuffer
	enc := json.NewEncoder(&w)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return w, nil
}

type lineBuffer []byte

func (l *lineBuffer) Write(p []byte) (int, error) { *l = append(*l, p...); return len(p), nil }

// quotedList renders filters for a message, each quoted so that the
// empty filter shows.
func quotedList(filters []string) string {
	out := ""
	for i, f := range filters {
		if i > 0 {
			out += ", "
		}
		out += fmt.Sprintf("%q", f)
	}
	return out
}
