package nats

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"weida.dev/connector/connectors"
)

var _ connectors.LastValueSource = (*Source)(nil)

// lastValuesBatch is how many stored messages one fetch of LastValues asks
// for.
const lastValuesBatch = 256

// LastValues implements [connectors.LastValueSource]: with JetStream it
// reads the last message of each subject the filters select from the
// bound stream, through a short-lived ordered consumer that delivers the
// last message per subject (DeliverLastPerSubjectPolicy) and is deleted
// afterwards; the durable consumer Read uses is untouched. Core NATS keeps
// nothing, so it returns nil at once. Call it after a successful Start.
func (s *Source) LastValues(ctx context.Context, filters []string, yield func(*connectors.Message)) error {
	if s.cfg.JetStream == nil || len(filters) == 0 {
		return nil
	}
	s.mu.Lock()
	js := s.js
	s.mu.Unlock()
	if js == nil {
		return errors.New("nats: LastValues before a successful Start")
	}
	for _, f := range filters {
		if err := s.lastValues(ctx, js, f, yield); err != nil {
			return err
		}
	}
	return nil
}

// lastValues reads the last message of each subject filter selects. One
// consumer per filter works with servers before 2.10, which have no
// consumers with several filter subjects; a subject two filters select is
// yielded twice, which a cache does not mind.
func (s *Source) lastValues(ctx context.Context, js jetstream.JetStream, filter string, yield func(*connectors.Message)) error {
	name := s.cfg.JetStream.Stream
	ctx, cancel := context.WithTimeout(ctx, 4*s.cfg.flushTimeout())
	defer cancel()
	stream, err := js.Stream(ctx, name)
	if err != nil {
		return fmt.Errorf("nats: jetstream stream %q: %w", name, err)
	}
	s.noteStream(stream)
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{filter},
		DeliverPolicy:     jetstream.DeliverLastPerSubjectPolicy,
		InactiveThreshold: time.Minute, // the server's clean-up, should the delete below fail
	})
	if err != nil {
		return fmt.Errorf("nats: jetstream stream %q: last values of %q: %w", name, filter, err)
	}
	defer func() {
		dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.flushTimeout())
		defer dcancel()
		if info := cons.CachedInfo(); info != nil {
			_ = stream.DeleteConsumer(dctx, info.Name)
		}
	}()
	if info := cons.CachedInfo(); info != nil && info.NumPending == 0 {
		return nil // nothing stored under the filters
	}
	for {
		batch, err := cons.Fetch(lastValuesBatch, jetstream.FetchMaxWait(s.cfg.flushTimeout()))
		if err != nil {
			return fmt.Errorf("nats: jetstream stream %q: last values of %q: %w", name, filter, err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			m := toMessage(msg.Subject(), msg.Data(), msg.Headers(), s.cfg.LoopMarker)
			m.Retained = true
			md := s.stored(m, msg)
			yield(m)
			// The stored messages are fixed when the consumer starts;
			// NumPending counts those not delivered yet.
			if md != nil && md.NumPending == 0 {
				return nil
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return fmt.Errorf("nats: jetstream stream %q: last values of %q: %w", name, filter, err)
		}
		if n == 0 {
			return nil // nothing more arrived within the wait
		}
	}
}

// noteStream keeps the stream's MaxAge, which ends its messages, and so
// the cached copies of them.
func (s *Source) noteStream(stream jetstream.Stream) {
	if info := stream.CachedInfo(); info != nil {
		s.maxAge.Store(int64(info.Config.MaxAge))
		s.msgTTL.Store(info.Config.AllowMsgTTL)
	}
}

// TTLHeader is the JetStream per-message TTL header (nats-server 2.11 and
// later, on a stream that allows it: elsewhere it is an ordinary header,
// and the server keeps the message).
const TTLHeader = "Nats-TTL"

// stored sets what the stream says of m, read from msg: its stream
// sequence (DATA key 68), when the server stored it, and when the stream
// drops it (its MaxAge, or its own TTL when sooner, where the stream
// allows TTLs). It returns the metadata it parsed, nil when msg has none,
// so that a caller needing more of it does not parse the reply subject a
// second time on the per-message path.
func (s *Source) stored(m *connectors.Message, msg jetstream.Msg) *jetstream.MsgMetadata {
	md, err := msg.Metadata()
	if err != nil {
		return nil
	}
	at := md.Timestamp
	m.SourceUnixNano = at.UnixNano()
	m.Sequence = md.Sequence.Stream
	life := time.Duration(s.maxAge.Load())
	if ttl, ok := messageTTL(msg.Headers().Get(TTLHeader)); ok && s.msgTTL.Load() && (life <= 0 || ttl < life) {
		life = ttl
	}
	if life > 0 {
		m.ExpiresUnixNano = at.Add(life).UnixNano()
	}
	return md
}

// messageTTL reads a Nats-TTL header as nats-server does: a Go duration
// or a whole number of seconds; "never" and anything unreadable set no TTL
// (the server refuses to store a message whose TTL it cannot read).
func messageTTL(v string) (time.Duration, bool) {
	if v == "" || strings.EqualFold(v, "never") {
		return 0, false
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return d, true
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil && n > 0 && n < int64(math.MaxInt64/time.Second) {
		return time.Duration(n) * time.Second, true
	}
	return 0, false
}
