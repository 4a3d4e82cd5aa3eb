package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"time"
)

// Plan is what [Compare] measures. The zero value is the reference
// measurement: 256-byte payloads, one-second samples, 1, 10 and 100
// subscribers, five rounds.
type Plan struct {
	Options

	// Load bounds each sample. Zero means one second.
	Load Load

	// Subscribers lists the weida rigs by subscriber count, each measured
	// in every round next to the raw rig. The rig with one subscriber is
	// the one compared with raw quic-go. Nil means 1, 10 and 100.
	Subscribers []int

	// Rounds is the number of samples of each rig. Zero means 5.
	Rounds int

	// Progress, when set, is called after each sample from Compare's
	// goroutine, with the round (from 1) and the rig's name.
	Progress func(round int, rig string, s Sample)
}

// Series is every sample of one rig, in round order.
type Series struct {
	Name      string
	Receivers int // copies per message: 1 for raw quic-go, else the subscribers
	Samples   []Sample
}

// Median returns the median of metric over the samples (the mean of the
// two middle ones for an even count), or 0 without samples.
func (s Series) Median(metric func(Sample) float64) float64 {
	v := make([]float64, len(s.Samples))
	for i, x := range s.Samples {
		v[i] = metric(x)
	}
	return Median(v)
}

// Median returns the median of v, or 0 when v is empty. It does not modify v.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// Report is the outcome of [Compare].
type Report struct {
	Options Options // with defaults applied
	Load    Load
	Rounds  int

	// Series holds raw quic-go first, then one series per entry of
	// Plan.Subscribers, in that order.
	Series []Series

	// Ratios holds, per round, the delivered rate of weida with one
	// subscriber divided by that of raw quic-go in the same round; empty
	// when Plan.Subscribers has no 1.
	Ratios []float64
}

// Raw returns the raw quic-go series.
func (r *Report) Raw() Series { return r.Series[0] }

// Single returns the series of weida with one subscriber, if measured.
func (r *Report) Single() (Series, bool) {
	for _, s := range r.Series[1:] {
		if s.Receivers == 1 {
			return s, true
		}
	}
	return Series{}, false
}

// CPURatio returns raw quic-go's median CPU time per copy divided by that
// of weida with one subscriber: the share of raw quic-go's efficiency
// weida keeps, which varies less than rates on a busy machine. ok is false
// when either is unknown.
func (r *Report) CPURatio() (ratio float64, ok bool) {
	one, found := r.Single()
	if !found {
		return 0, false
	}
	raw := r.Raw().Median(cpuPerCopy)
	w := one.Median(cpuPerCopy)
	if raw == 0 || w == 0 {
		return 0, false
	}
	return raw / w, true
}

func cpuPerCopy(s Sample) float64 { return float64(s.CPUPerCopy()) }

// Compare measures raw quic-go and package weida over loopback in one
// process: it sets up every rig, warms each up, then runs Rounds rounds in
// which every rig takes one sample (see [sampleOrder]), so that drift in
// the machine's load spreads over all of them. A garbage collection before
// each sample keeps one rig's garbage out of the next one's numbers. Setup
// is not measured. ctx aborts the whole comparison.
//
// Setup, warm-up and the sampling rounds stay in one function because
// their order is the measurement method.
func Compare(ctx context.Context, p Plan) (*Report, error) {
	opts, err := p.Options.withDefaults()
	if err != nil {
		return nil, err
	}
	if p.Load == (Load{}) {
		p.Load.Duration = time.Second
	}
	if err := p.Load.check(); err != nil {
		return nil, err
	}
	if p.Subscribers == nil {
		p.Subscribers = []int{1, 10, 100}
	}
	if p.Rounds == 0 {
		p.Rounds = 5
	}
	if p.Rounds < 0 {
		return nil, fmt.Errorf("bench: %d rounds", p.Rounds)
	}

	var rigs []Rig
	defer func() {
		for _, r := range rigs {
			_ = r.Close()
		}
	}()
	raw, err := NewRaw(ctx, 1, opts)
	if err != nil {
		return nil, err
	}
	rigs = append(rigs, raw)
	for _, n := range p.Subscribers {
		w, err := NewWeida(ctx, n, opts)
		if err != nil {
			return nil, err
		}
		rigs = append(rigs, w)
	}

	rep := &Report{Options: opts, Load: p.Load, Rounds: p.Rounds, Series: make([]Series, len(rigs))}
	for i, r := range rigs {
		rep.Series[i] = Series{Name: r.Name(), Receivers: r.Receivers()}
		warm := Load{Messages: int64(2 * opts.Window), Duration: 250 * time.Millisecond}
		if _, err := r.Run(ctx, warm); err != nil {
			return nil, fmt.Errorf("%s: warm-up: %w", r.Name(), err)
		}
	}
	single := -1
	for i, r := range rigs[1:] {
		if r.Receivers() == 1 {
			single = i + 1
		}
	}
	for round := range p.Rounds {
		for _, i := range sampleOrder(round, len(rigs), single) {
			runtime.GC()
			s, err := rigs[i].Run(ctx, p.Load)
			if err != nil {
				return nil, fmt.Errorf("%s: round %d: %w", rigs[i].Name(), round+1, err)
			}
			if s.Copies == 0 {
				return nil, errors.New("bench: a sample delivered nothing; give a longer load")
			}
			rep.Series[i].Samples = append(rep.Series[i].Samples, s)
			if p.Progress != nil {
				p.Progress(round+1, rigs[i].Name(), s)
			}
		}
	}
	if one, ok := rep.Single(); ok {
		for i, s := range one.Samples {
			rep.Ratios = append(rep.Ratios, s.CopiesPerSecond()/rep.Series[0].Samples[i].CopiesPerSecond())
		}
	}
	return rep, nil
}

// sampleOrder returns the order in which the rigs (raw quic-go at 0) take
// their samples in a round. The two rigs whose ratio is the goal, raw
// quic-go and weida with one subscriber (single, or -1 without one), run
// back to back, each first in every other round, so that the machine's
// load changes as little as possible between the two samples of a ratio.
// The fan-out rigs follow, starting with a different one each round.
func sampleOrder(round, rigs, single int) []int {
	order := []int{0}
	if single > 0 {
		order = append(order, single)
		if round%2 == 1 {
			order[0], order[1] = single, 0
		}
	}
	var rest []int
	for i := 1; i < rigs; i++ {
		if i != single {
			rest = append(rest, i)
		}
	}
	for k := range rest {
		order = append(order, rest[(round+k)%len(rest)])
	}
	return order
}
