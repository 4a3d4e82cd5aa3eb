// Package bench measures how fast package weida delivers messages over
// loopback, against the limit of the transport under it: raw quic-go doing
// the same stream work without weida.
//
// A weida copy is one QUIC uni stream carrying a DATA preamble and header,
// the payload and a FIN. [Raw] does exactly that stream work with the same
// bytes and nothing else: it opens a uni stream, writes the frame a weida
// publisher would write, closes it, and the other side accepts the stream
// and reads it to its FIN. [Weida] publishes through a [weida.Publisher] to
// one or more [weida.Subscriber]s that call Receive. Both keep at most
// [Options.Window] copies in flight per receiver, so that they measure
// delivery rather than drops.
//
// The Go benchmarks of this package and the command `connector weida bench`
// both run these rigs, so the numbers they report measure the same thing.
// [Compare] is the command's method: it alternates the rigs over several
// rounds in one process, because on a shared machine a single sample can be
// off by a factor of two, and it records the CPU time of every sample, which
// varies less than wall time.
//
// Every measurement runs publisher and receivers in this process on
// 127.0.0.1, so a sample's CPU time covers both sides; [ProfiledRun]
// splits it between them, and from other rigs' work, with a CPU profile.
package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/google/pprof/profile"

	"weida.dev/connector/internal/proccpu"
	"weida.dev/connector/weida/wire"
)

// Defaults of [Options].
const (
	DefaultSize   = 256 // payload bytes
	DefaultWindow = 512 // copies in flight per receiver
)

// Options shapes the messages and the flow of one rig. The zero value uses
// the defaults.
type Options struct {
	// Size is the payload of every message, in bytes. Zero means
	// DefaultSize.
	Size int

	// Window is the number of copies one receiver may have outstanding
	// (sent but not yet received). It must stay well under the publisher's
	// per-subscriber budget (8 MiB by default), or a weida rig would
	// measure drops. Zero means DefaultWindow.
	Window int

	// Receipts makes a weida rig track receipts (Publisher.TrackReceipts)
	// and publish with PublishWithReceipt, waiting for none of them: the
	// cost of spec.delivery.acknowledge: received. Raw rigs ignore it.
	Receipts bool
	// IdleTimeout is a weida rig's listener IdleTimeout; zero keeps
	// weida's default (DefaultListenerIdleTimeout). Raw rigs ignore it.
	// With a thousand subscribers in the measuring process, the default
	// can close a reading subscriber (docs/PERFORMANCE.md).
	IdleTimeout time.Duration

	// CountPackets makes the rig count the QUIC packets each end sends,
	// by what they carry, into every Sample (EndpointPackets,
	// ReceiverPackets). It traces every packet through quic-go's qlog
	// events, which costs CPU: leave it off where CPU is measured.
	CountPackets bool
}

func (o Options) withDefaults() (Options, error) {
	if o.Size < 0 || o.Window < 0 || o.IdleTimeout < 0 {
		return o, fmt.Errorf("bench: negative size %d, window %d or idle timeout %v", o.Size, o.Window, o.IdleTimeout)
	}
	if o.Size == 0 {
		o.Size = DefaultSize
	}
	if o.Window == 0 {
		o.Window = DefaultWindow
	}
	return o, nil
}

// Topic and Path are what every rig publishes on; the raw rig writes the
// frame a weida publisher would write for them.
const (
	Topic = "bench.topic"
	Path  = "/bench"
)

// Frame returns the bytes a weida publisher writes on a copy's stream for a
// payload of size bytes on [Path] and [Topic]: the DATA preamble and header,
// then the payload. The raw rig writes exactly these bytes.
func Frame(size int) []byte {
	d := wire.Data{
		Endpoint: Path, HasEndpoint: true,
		ContentLen: uint64(size), HasContentLen: true,
		Topic: Topic, HasTopic: true,
	}
	b := wire.AppendData(nil, &d)
	b = wire.InsertPreamble(b, 0, wire.KindData)
	return append(b, make([]byte, size)...)
}

// Load says how long one sample runs: it stops after Messages messages or
// after Duration, whichever comes first. A zero field is no bound; at least
// one must be set.
type Load struct {
	Messages int64
	Duration time.Duration
}

func (l Load) check() error {
	switch {
	case l.Messages < 0 || l.Duration < 0:
		return fmt.Errorf("bench: negative load %+v", l)
	case l.Messages == 0 && l.Duration == 0:
		return errors.New("bench: a load needs a message count or a duration")
	}
	return nil
}

// Sample is one run of a rig. CPU and Allocs are those of the whole
// process, which holds both sides of the loopback connections.
type Sample struct {
	Messages int64         // messages sent: Publish calls, or raw streams opened
	Copies   int64         // copies received, over every receiver
	Elapsed  time.Duration // from the first send until the last copy was read
	CPU      time.Duration // user and system CPU time; 0 where the platform does not report it
	Allocs   uint64        // heap allocations
	// EndpointPackets and ReceiverPackets are the packets each end sent,
	// with Options.CountPackets; zero without.
	EndpointPackets, ReceiverPackets Packets
}

// MessagesPerSecond is the rate of messages sent.
func (s Sample) MessagesPerSecond() float64 { return perSecond(s.Messages, s.Elapsed) }

// CopiesPerSecond is the rate of copies received; with one receiver it
// equals MessagesPerSecond.
func (s Sample) CopiesPerSecond() float64 { return perSecond(s.Copies, s.Elapsed) }

// CPUPerCopy is the process's CPU time per copy received, or 0 when CPU
// time is not known or nothing was received.
func (s Sample) CPUPerCopy() time.Duration {
	if s.Copies == 0 {
		return 0
	}
	return s.CPU / time.Duration(s.Copies)
}

// AllocsPerCopy is the number of heap allocations per copy received.
func (s Sample) AllocsPerCopy() float64 {
	if s.Copies == 0 {
		return 0
	}
	return float64(s.Allocs) / float64(s.Copies)
}

func perSecond(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// Rig is one prepared measurement: connections set up, nothing flowing.
// Run may be called any number of times, one at a time; after a Run that
// failed, copies may still be in flight and the rig is fit only for Close.
// Close releases the connections and waits for the rig's goroutines.
type Rig interface {
	// Name describes the rig ("raw quic-go", "weida, 10 subscribers").
	Name() string
	// Receivers is the number of receivers each message is copied to.
	Receivers() int
	// Run sends messages until load is reached and every copy has been
	// received. ctx aborts it with an error.
	Run(ctx context.Context, load Load) (Sample, error)
	// Label is the value of RigLabel on the rig's goroutines.
	Label() string
	Close() error
}

// meter takes the process's CPU and allocation counters at the start of a
// sample and turns them into the sample's share at its end.
type meter struct {
	start              time.Time
	cpu                time.Duration
	allocs             uint64
	packets            *rigCounters // nil: not counted
	endpoint, receiver Packets
}

func startMeter(packets *rigCounters) meter {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m := meter{start: time.Now(), cpu: proccpu.Self(), allocs: ms.Mallocs, packets: packets}
	m.endpoint, m.receiver = packets.snapshot()
	return m
}

func (m meter) stop(messages, copies int64) Sample {
	elapsed := time.Since(m.start)
	cpu := proccpu.Self()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s := Sample{Messages: messages, Copies: copies, Elapsed: elapsed, Allocs: ms.Mallocs - m.allocs}
	endpoint, receiver := m.packets.snapshot()
	s.EndpointPackets, s.ReceiverPackets = endpoint.sub(m.endpoint), receiver.sub(m.receiver)
	if cpu > 0 && m.cpu > 0 {
		s.CPU = cpu - m.cpu
	}
	return s
}

// credits is the flow control shared by both rigs: each receiver starts
// with Window credits, the sender takes one from every receiver before each
// message, and a receiver returns one per copy read. Taking every credit
// back therefore means every copy has been read.
type credits struct {
	ch     []chan struct{}
	window int
	errs   chan error // receivers report their first failure here
}

func newCredits(receivers, window int) *credits {
	c := &credits{ch: make([]chan struct{}, receivers), window: window, errs: make(chan error, receivers)}
	for i := range c.ch {
		c.ch[i] = make(chan struct{}, window)
		for range window {
			c.ch[i] <- struct{}{}
		}
	}
	return c
}

// take takes one credit of receiver i, failing when a receiver failed or
// ctx ended.
func (c *credits) take(ctx context.Context, i int) error {
	select {
	case <-c.ch[i]:
		return nil
	default:
	}
	select {
	case <-c.ch[i]:
		return nil
	case err := <-c.errs:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// takeAll takes one credit of every receiver.
func (c *credits) takeAll(ctx context.Context) error {
	for i := range c.ch {
		if err := c.take(ctx, i); err != nil {
			return err
		}
	}
	return nil
}

// drain takes back every outstanding credit: it returns once every copy
// sent has been read.
func (c *credits) drain(ctx context.Context) error {
	for i := range c.ch {
		for range c.window {
			if err := c.take(ctx, i); err != nil {
				return err
			}
		}
	}
	return nil
}

// give returns a credit of receiver i.
func (c *credits) give(i int) { c.ch[i] <- struct{}{} }

// fail records a receiver's failure; only the first of each receiver is
// kept, and there is room for one per receiver.
func (c *credits) fail(err error) {
	select {
	case c.errs <- err:
	default:
	}
}

// sendLoop calls send once per message, after taking a credit of every
// receiver, until load is reached, then waits until every copy was read.
// It returns the number of messages sent.
func sendLoop(ctx context.Context, load Load, c *credits, send func() error) (int64, error) {
	var deadline time.Time
	if load.Duration > 0 {
		deadline = time.Now().Add(load.Duration)
	}
	var n int64
	for load.Messages == 0 || n < load.Messages {
		// Reading the clock every 64 messages keeps its cost out of the
		// measurement; at a few microseconds per message the overshoot is
		// well under a millisecond.
		if !deadline.IsZero() && n%64 == 0 && time.Now().After(deadline) {
			break
		}
		if err := c.takeAll(ctx); err != nil {
			return n, err
		}
		if err := send(); err != nil {
			return n, err
		}
		n++
	}
	return n, c.drain(ctx)
}

// The rigs label their goroutines for CPU profiles (runtime/pprof), so
// that a profile taken while a rig runs says whose CPU it sampled: which
// rig (RigLabel, a value of its own per rig, Rig.Label) and which end of
// its connections (SideLabel: SideEndpoint on the listener's side, the
// publisher, its writers and its connections' QUIC goroutines;
// SideReceiver on the dialling side). Goroutines quic-go or package weida
// start inherit the labels of the one that starts them; what runs under
// none (the garbage collector's background work, the scheduler, timer
// functions) is shared runtime.
const (
	RigLabel     = "rig"
	SideLabel    = "side"
	SideEndpoint = "endpoint"
	SideReceiver = "receiver"
)

var rigLabels atomic.Int64

// newRigLabel is a value of RigLabel no other rig in the process has.
func newRigLabel() string { return strconv.FormatInt(rigLabels.Add(1), 10) }

// setupLabels are the labels a rig's end carries from its setup on.
func setupLabels(rig, side string) pprof.LabelSet {
	return pprof.Labels(RigLabel, rig, SideLabel, side)
}

// labelSide sets the calling goroutine's labels to rig's side and returns
// what restores the labels ctx carries.
func labelSide(ctx context.Context, rig, side string) (restore func()) {
	pprof.SetGoroutineLabels(pprof.WithLabels(ctx, setupLabels(rig, side)))
	return func() { pprof.SetGoroutineLabels(ctx) }
}

// CPU is what a CPU profile sampled while one rig ran, by whose work it
// was. The profile samples 100 times a second per busy thread, so a 2 s
// sample on two cores holds about 400 samples.
type CPU struct {
	Endpoint time.Duration // the rig's sending end
	Receiver time.Duration // the rig's receiving end
	// Runtime ran under no label: the collector's background work, the
	// scheduler, timer functions; every rig in the process shares it.
	Runtime time.Duration
	// OtherRigs is the work of other rigs alive in the process while this
	// one ran: their keep-alives, which are not this rig's cost.
	OtherRigs time.Duration
}

// Rig is the CPU the rig's own run took: both its ends and the shared
// runtime, without other rigs' work.
func (c CPU) Rig() time.Duration { return c.Endpoint + c.Receiver + c.Runtime }

// ProfiledRun runs r under a CPU profile and returns, with the sample,
// what the profile says of whose CPU the run took. Both ends of a rig's
// connections share the process, and so may other rigs: the sample's CPU
// time (getrusage) counts them all, the profile tells them apart. No other
// CPU profile may be running.
func ProfiledRun(ctx context.Context, r Rig, load Load) (Sample, CPU, error) {
	var buf bytes.Buffer
	if err := pprof.StartCPUProfile(&buf); err != nil {
		return Sample{}, CPU{}, fmt.Errorf("bench: CPU profile: %w", err)
	}
	var s Sample
	var runErr error
	func() {
		defer pprof.StopCPUProfile() // so that a panic in Run leaves no profile running
		s, runErr = r.Run(ctx, load)
	}()
	if runErr != nil {
		return s, CPU{}, runErr
	}
	p, err := profile.Parse(&buf)
	if err != nil {
		return s, CPU{}, fmt.Errorf("bench: CPU profile: %w", err)
	}
	cpu := slices.IndexFunc(p.SampleType, func(v *profile.ValueType) bool { return v.Type == "cpu" && v.Unit == "nanoseconds" })
	if cpu < 0 {
		return s, CPU{}, fmt.Errorf("bench: CPU profile without cpu/nanoseconds samples: %v", p.SampleType)
	}
	var c CPU
	for _, sm := range p.Sample {
		d := time.Duration(sm.Value[cpu])
		rig, side := sm.Label[RigLabel], sm.Label[SideLabel]
		switch {
		case len(rig) == 0:
			c.Runtime += d
		case rig[0] != r.Label():
			c.OtherRigs += d
		case len(side) > 0 && side[0] == SideEndpoint:
			c.Endpoint += d
		default:
			c.Receiver += d
		}
	}
	return s, c, nil
}
