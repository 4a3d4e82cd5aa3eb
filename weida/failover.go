package weida

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"weida.dev/connector/weida/address"
	"weida.dev/connector/weida/wire"
)

// DefaultFailoverStagger is how long [Failover.Dial] waits for one address
// before it also dials the next (RFC 8305's connection attempt delay).
const DefaultFailoverStagger = 250 * time.Millisecond

// Failover dials one publisher path that several addresses serve: the
// replicas of one endpoint, of which one or more listen at a time (with
// leases, only the holder does). Every address names the same path and
// pins the same fingerprint, so the subscriber keeps its path, filters
// and trust whichever address answers.
//
// Each Dial tries the addresses in order, starting with the one that last
// answered or, once the connection it gave was lost, with the next one:
// the address that was lost is the likeliest to be down. An address that
// fails moves Dial to the next at once; one that has not answered after
// Stagger is given company by the next, and the first to complete the
// HELLO exchange wins, so an address that drops packets without a word
// (a replica that stopped, whose port is closed) costs a stagger, not a
// handshake timeout. An address counts as answering only once it has also
// said that it publishes the path (see [ErrPathNotServed]). When every
// address fails, Dial returns an error that
// unwraps to each address's; retrying with a backoff is the caller's, as
// with [Dial].
//
// A Failover is safe for concurrent use, though a caller normally holds
// one Subscriber at a time. It starts no goroutine that outlives Dial.
type Failover struct {
	urls    []string
	cfg     DialConfig
	stagger time.Duration

	mu   sync.Mutex
	pref int // the address tried first
	// last is how the latest connection Dial returned ended, or nil: not
	// the Subscriber itself, which the caller may have closed and dropped
	// with its unread copies long before the next Dial.
	last *subEnd
	at   int // last's address
}

// NewFailover returns a Failover over urls, in the order to try them; cfg
// applies to every address. The URLs must parse (see [Dial]) and be
// replicas of one endpoint ([address.CheckReplicas]); otherwise NewFailover
// returns the first fault. stagger zero means [DefaultFailoverStagger].
// With one URL a Failover dials it as [Dial] does.
func NewFailover(urls []string, cfg DialConfig, stagger time.Duration) (*Failover, error) {
	if len(urls) == 0 {
		return nil, errors.New("weida: a failover dialer needs at least one address")
	}
	addrs := make([]address.Address, len(urls))
	for i, u := range urls {
		a, err := address.Parse(u)
		if err != nil {
			return nil, err
		}
		addrs[i] = a
	}
	if errs := address.CheckReplicas(addrs, urls); len(errs) > 0 {
		return nil, errs[0]
	}
	if stagger <= 0 {
		stagger = DefaultFailoverStagger
	}
	return &Failover{urls: append([]string(nil), urls...), cfg: cfg, stagger: stagger}, nil
}

// URLs returns the addresses, in the order given. The slice is the
// caller's.
func (f *Failover) URLs() []string { return append([]string(nil), f.urls...) }

// Dial connects to the first address that answers, as described on
// [Failover]. ctx bounds the whole dial, every address included.
func (f *Failover) Dial(ctx context.Context) (*Subscriber, error) {
	if len(f.urls) == 1 {
		return Dial(ctx, f.urls[0], f.cfg)
	}
	f.mu.Lock()
	first := f.pref
	if f.last != nil && f.last.lost() {
		first = (f.at + 1) % len(f.urls)
	}
	f.mu.Unlock()

	i, s, err := f.race(ctx, first)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.pref, f.last, f.at = i, s.end, i
	f.mu.Unlock()
	return s, nil
}

type dialResult struct {
	i   int
	s   *Subscriber
	err error
}

// race dials the addresses from first on, each Stagger after the previous
// one or as soon as it fails, and returns the first to connect and pass
// [checkPath]. Every
// other dial is cancelled, and its connection closed, before race returns.
func (f *Failover) race(ctx context.Context, first int) (int, *Subscriber, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	n := len(f.urls)
	results := make(chan dialResult, n)
	launched, pending := 0, 0
	launch := func() {
		i := (first + launched) % n
		launched++
		pending++
		go func() {
			s, err := Dial(ctx, f.urls[i], f.cfg)
			if err == nil {
				if err = checkPath(ctx, s); err != nil {
					_ = s.Close()
					s, err = nil, fmt.Errorf("weida: dial %s: %w", f.urls[i], err)
				}
			}
			results <- dialResult{i, s, err}
		}()
	}
	launch()
	stagger := time.NewTimer(f.stagger)
	defer stagger.Stop()
	errs := make([]error, n)
	winner := dialResult{i: -1}
	for pending > 0 {
		select {
		case r := <-results:
			pending--
			switch {
			case r.err == nil && winner.s == nil:
				winner = r
				cancel()
			case r.err == nil:
				_ = r.s.Close() // a later answer than the winner's
			case winner.s == nil:
				errs[r.i] = r.err
				// Once ctx has ended every dial fails with its error: the
				// untried addresses stay untried (nil in FailoverError).
				if launched < n && ctx.Err() == nil {
					loggerOrDiscard(f.cfg.Logger).Info("weida: an address of the endpoint did not answer; dialling the next",
						"url", f.urls[r.i], "next", f.urls[(first+launched)%n], "err", r.err)
					launch()
					stagger.Reset(f.stagger)
				}
			}
		case <-stagger.C:
			if winner.s == nil && launched < n && ctx.Err() == nil {
				launch()
				stagger.Reset(f.stagger)
			}
		}
	}
	if winner.s != nil {
		return winner.i, winner.s, nil
	}
	return -1, nil, &FailoverError{URLs: f.urls, Errs: errs}
}

// FailoverError is the failure of a [Failover.Dial] at which no address
// answered. Errs holds each address's error, in the order of URLs (nil for
// one not tried, when ctx ended first).
type FailoverError struct {
	URLs []string
	Errs []error
}

func (e *FailoverError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "weida: none of the %d addresses of the endpoint answered", len(e.URLs))
	for _, err := range e.Errs {
		if err != nil {
			b.WriteString("; ")
			b.WriteString(err.Error())
		}
	}
	return b.String()
}

// Unwrap returns each address's error, so that errors.Is and errors.As
// find, say, [ErrFingerprintMismatch] when one address presented another
// certificate.
func (e *FailoverError) Unwrap() []error {
	var out []error
	for _, err := range e.Errs {
		if err != nil {
			out = append(out, err)
		}
	}
	return out
}

// ErrPathNotServed is wrapped by the error of an address of a [Failover]
// that completed HELLO but registers nothing at the path. HELLO names no
// path, and a listener records a SUBSCRIBE for a path it does not publish
// (PROTOCOL §6.4: a subscriber may come before its publisher), so a
// listener on the same port that publishes another endpoint, such as a
// replica that holds another resource's lease, would otherwise win the
// dial and deliver nothing, without a word.
var ErrPathNotServed = errors.New("weida: the address publishes nothing at the path")

// checkPath asks the publisher whether it registers s's path, by the one
// question weida v0 answers per path (PROTOCOL §9.4, §6.3): a bidi DATA
// exchange, which a publisher path refuses with ERROR UNSUPPORTED and a
// path that holds nothing with ERROR UNKNOWN_ENDPOINT. Only the latter is
// [ErrPathNotServed]; any other answer (another ERROR code, such as
// REJECTED from an authorizing peer, a reply, a reset stream) proves
// nothing either way and leaves the address in the race, as it was before
// the question. It costs one round trip, on a stream the peer counts as
// refused. An error is returned only for ErrPathNotServed, or when the
// connection or ctx ended while asking.
func checkPath(ctx context.Context, s *Subscriber) error {
	st, err := s.c.qc.OpenStreamSync(ctx)
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() {
		st.CancelRead(quic.StreamErrorCode(Canceled))
		st.CancelWrite(quic.StreamErrorCode(Canceled))
	})
	defer stop()
	hdr := wire.AppendData(nil, &wire.Data{Endpoint: s.addr.Path, HasEndpoint: true})
	// The peer may stop the request half before the write completes
	// (STOP_SENDING UNSUPPORTED or UNKNOWN_ENDPOINT): its answer is on the
	// reply half either way.
	_, _ = st.Write(wire.AppendPreamble(nil, wire.KindData, hdr))
	_ = st.Close()
	reply, rerr := io.ReadAll(io.LimitReader(st, int64(s.limits.MaxHeaderBytes)+16))
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := s.c.ctx.Err(); err != nil {
		return s.connErr()
	}
	st.CancelRead(quic.StreamErrorCode(Canceled)) // whatever is left is not read
	if rerr != nil {
		return nil // a reset reply half: no answer
	}
	k, h, _, err := wire.ParsePreamble(reply, s.limits.MaxHeaderBytes)
	if err != nil || k != wire.KindError {
		return nil
	}
	if e, err := wire.DecodeErrorFrame(h); err == nil && e.Code == wire.ErrorUnknownEndpoint {
		return fmt.Errorf("%w %q (it answered UNKNOWN_ENDPOINT): it listens for another endpoint on this port", ErrPathNotServed, s.addr.Path)
	}
	return nil
}
