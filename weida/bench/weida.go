package bench

import (
	"context"
	"fmt"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"weida.dev/connector/weida"
)

// Weida publishes through package weida: one [weida.Listener] with a
// publisher at [Path], and a number of [weida.Subscriber]s dialled over
// 127.0.0.1, each subscribed to every topic and calling Receive. Each
// message is one Publish of an Options.Size payload on [Topic]; it is
// delivered once every subscriber has received its copy.
//
// Create it with [NewWeida]; it is a [Rig]. Run must not be called
// concurrently with itself.
type Weida struct {
	opts    Options
	label   string       // RigLabel's value
	packets *rigCounters // with opts.CountPackets
	l       *weida.Listener
	pub     *weida.Publisher
	subs    []*weida.Subscriber
	msg     weida.Message
}

// NewWeida listens, dials subscribers times and waits until the publisher
// holds every subscription; ctx bounds the setup.
func NewWeida(ctx context.Context, subscribers int, opts Options) (*Weida, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if subscribers < 1 {
		return nil, fmt.Errorf("bench: %d subscribers; need at least one", subscribers)
	}
	// Every subscriber dials from 127.0.0.1: the per-address limit would
	// refuse all but the first 64, and the listener's all but 1,024.
	label := newRigLabel()
	packets := newRigCounters(opts)
	tracer := packets.quicTracer()
	var l *weida.Listener
	pprof.Do(ctx, setupLabels(label, SideEndpoint), func(ctx context.Context) {
		l, err = weida.Listen(ctx, "127.0.0.1:0", weida.ListenConfig{QUICTracer: tracer, Limits: weida.Limits{
			MaxConnections:           max(subscribers, weida.DefaultMaxConnections),
			MaxConnectionsPerAddress: max(subscribers, weida.DefaultMaxConnectionsPerAddress),
			IdleTimeout:              opts.IdleTimeout,
		}})
	})
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	w := &Weida{opts: opts, label: label, packets: packets, l: l, msg: weida.Message{Topic: Topic, Payload: make([]byte, opts.Size)}}
	if w.pub, err = l.Publisher(Path); err != nil {
		_ = w.Close()
		return nil, fmt.Errorf("bench: %w", err)
	}
	if opts.Receipts {
		w.pub.TrackReceipts()
	}
	url := fmt.Sprintf("weida://%s@%s%s", l.Fingerprint(), l.Addr(), Path)
	for range subscribers {
		var s *weida.Subscriber
		pprof.Do(ctx, setupLabels(label, SideReceiver), func(ctx context.Context) {
			s, err = weida.Dial(ctx, url, weida.DialConfig{QUICTracer: tracer})
		})
		if err != nil {
			_ = w.Close()
			return nil, fmt.Errorf("bench: %w", err)
		}
		w.subs = append(w.subs, s)
		if err := s.Subscribe(ctx, ""); err != nil {
			_ = w.Close()
			return nil, fmt.Errorf("bench: %w", err)
		}
	}
	// Subscribe returns once the frame is written; wait until the
	// listener has applied each, or the first messages would match nobody.
	for w.pub.Subscribers() < subscribers {
		select {
		case <-ctx.Done():
			_ = w.Close()
			return nil, fmt.Errorf("bench: waiting for %d subscriptions: %w", subscribers, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
	return w, nil
}

// Name implements [Rig].
func (w *Weida) Name() string {
	if len(w.subs) == 1 {
		return "weida, 1 subscriber"
	}
	return fmt.Sprintf("weida, %d subscribers", len(w.subs))
}

// Receivers implements [Rig]: the number of subscribers.
func (w *Weida) Receivers() int { return len(w.subs) }

// Label implements [Rig].
func (w *Weida) Label() string { return w.label }

// Listener returns the rig's listener, for its counters.
func (w *Weida) Listener() *weida.Listener { return w.l }

// Publisher returns the rig's publisher, for a measurement that publishes
// messages of its own instead of calling Run.
func (w *Weida) Publisher() *weida.Publisher { return w.pub }

// Subscribers returns the rig's subscribers, each subscribed to every
// topic, for a measurement that reads them itself instead of calling Run.
func (w *Weida) Subscribers() []*weida.Subscriber { return w.subs }

// Run implements [Rig]. A copy dropped by the publisher (which the window
// should make impossible) fails the run, since it would not be delivered.
func (w *Weida) Run(ctx context.Context, load Load) (Sample, error) {
	if err := load.check(); err != nil {
		return Sample{}, err
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	c := newCredits(len(w.subs), w.opts.Window)
	var copies atomic.Int64
	for i, s := range w.subs {
		wg.Go(func() {
			labelSide(rctx, w.label, SideReceiver)
			for {
				if _, err := s.Receive(rctx); err != nil {
					if rctx.Err() == nil {
						c.fail(fmt.Errorf("bench: subscriber %d: %w", i, err))
					}
					return
				}
				copies.Add(1)
				c.give(i)
			}
		})
	}
	want := len(w.subs)
	defer labelSide(ctx, w.label, SideEndpoint)()
	m := startMeter(w.packets)
	n, err := sendLoop(ctx, load, c, func() error {
		var r weida.Result
		var err error
		if w.opts.Receipts {
			r, err = w.pub.PublishWithReceipt(ctx, w.msg, nil, func(weida.Receipt) {})
		} else {
			r, err = w.pub.Publish(ctx, w.msg)
		}
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		if r.Queued != want {
			return fmt.Errorf("bench: publish queued %d of %d copies (%+v)", r.Queued, want, r)
		}
		return nil
	})
	return m.stop(n, copies.Load()), err
}

// Close closes the subscribers and the listener and waits for their
// goroutines.
func (w *Weida) Close() error {
	for _, s := range w.subs {
		_ = s.Close()
	}
	return w.l.Close()
}
