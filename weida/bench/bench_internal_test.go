package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/quic-go/quic-go/qlog"
	"go.uber.org/goleak"
	"pgregory.net/rapid"

	"weida.dev/connector/internal/proccpu"
	"weida.dev/connector/weida/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestFrame: the raw rig writes what a weida publisher writes for a
// message on Path and Topic: a DATA preamble, a header a subscriber
// accepts, and the payload.
func TestFrame(t *testing.T) {
	for _, size := range []int{0, 1, 256, 70000} {
		f := Frame(size)
		kind, hdr, n, err := wire.ParsePreamble(f, wire.DefaultMaxHeaderBytes)
		if err != nil || kind != wire.KindData {
			t.Fatalf("size %d: ParsePreamble = %v, %v", size, kind, err)
		}
		d, err := wire.DecodeData(hdr)
		if err != nil {
			t.Fatalf("size %d: DecodeData: %v", size, err)
		}
		if d.Endpoint != Path || d.Topic != Topic || d.ContentLen != uint64(size) {
			t.Errorf("size %d: header %+v", size, d)
		}
		if got := len(f) - n; got != size {
			t.Errorf("size %d: %d payload bytes", size, got)
		}
	}
}

func TestLoadCheck(t *testing.T) {
	for _, tc := range []struct {
		load Load
		ok   bool
	}{
		{Load{}, false},
		{Load{Messages: -1}, false},
		{Load{Duration: -time.Second}, false},
		{Load{Messages: 1}, true},
		{Load{Duration: time.Millisecond}, true},
		{Load{Messages: 1, Duration: time.Millisecond}, true},
	} {
		if err := tc.load.check(); (err == nil) != tc.ok {
			t.Errorf("%+v: check = %v, want ok %v", tc.load, err, tc.ok)
		}
	}
}

func TestOptions(t *testing.T) {
	o, err := Options{}.withDefaults()
	if err != nil || o.Size != DefaultSize || o.Window != DefaultWindow {
		t.Errorf("zero Options = %+v, %v", o, err)
	}
	for _, bad := range []Options{{Size: -1}, {Window: -1}} {
		if _, err := bad.withDefaults(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{3, 1}, 2},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		in := slices.Clone(tc.in)
		if got := Median(in); got != tc.want {
			t.Errorf("Median(%v) = %v, want %v", tc.in, got, tc.want)
		}
		if !slices.Equal(in, tc.in) {
			t.Errorf("Median modified its input: %v", in)
		}
	}
}

// TestMedianProperty: the median does not depend on order, lies between
// the extremes, and has as many values at or below it as at or above it.
func TestMedianProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		v := rapid.SliceOfN(rapid.Float64Range(-1e6, 1e6), 1, 50).Draw(t, "v")
		m := Median(v)
		p := slices.Clone(v)
		for i := len(p) - 1; i > 0; i-- {
			j := rapid.IntRange(0, i).Draw(t, "j")
			p[i], p[j] = p[j], p[i]
		}
		if Median(p) != m {
			t.Fatalf("Median(%v) = %v, of a permutation %v", v, m, Median(p))
		}
		if m < slices.Min(v) || m > slices.Max(v) {
			t.Fatalf("Median(%v) = %v, outside the range", v, m)
		}
		var below, above int
		for _, x := range v {
			if x <= m {
				below++
			}
			if x >= m {
				above++
			}
		}
		if 2*below < len(v) || 2*above < len(v) {
			t.Fatalf("Median(%v) = %v: %d at or below, %d at or above", v, m, below, above)
		}
	})
}

// TestRigs runs each rig with a small window, so that the sender waits
// for credits, under both kinds of load: every message sent is received by
// every receiver, and the counters agree.
func TestRigs(t *testing.T) {
	ctx := context.Background()
	opts := Options{Size: 100, Window: 4}
	raw, err := NewRaw(ctx, 1, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	rawThree, err := NewRaw(ctx, 3, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer rawThree.Close()
	one, err := NewWeida(ctx, 1, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	three, err := NewWeida(ctx, 3, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer three.Close()
	for _, rig := range []Rig{raw, rawThree, one, three} {
		t.Run(rig.Name(), func(t *testing.T) {
			s, err := rig.Run(ctx, Load{Messages: 200})
			if err != nil {
				t.Fatal(err)
			}
			if s.Messages != 200 || s.Copies != 200*int64(rig.Receivers()) {
				t.Errorf("count load: %+v", s)
			}
			if s.Elapsed <= 0 || s.MessagesPerSecond() <= 0 || s.CopiesPerSecond() < s.MessagesPerSecond() {
				t.Errorf("rates of %+v", s)
			}
			s, err = rig.Run(ctx, Load{Duration: 20 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			if s.Messages == 0 || s.Copies != s.Messages*int64(rig.Receivers()) {
				t.Errorf("duration load: %+v", s)
			}
		})
	}
	if st := three.Listener().Stats(); st.Dropped.Total() != 0 || st.CopiesWritten != st.CopiesQueued {
		t.Errorf("listener stats after the runs: %+v", st)
	}
}

// TestCountPackets: with CountPackets, each sample counts the packets
// either end sent: the copies' at the sending end, the acknowledgements
// and new stream credit at the receiving end; without it, nothing. (The
// classification itself is TestClassifyPackets's.)
func TestCountPackets(t *testing.T) {
	ctx := context.Background()
	const size, messages = 100, 200
	for _, rig := range []struct {
		name string
		new  func(Options) (Rig, error)
	}{
		{"raw", func(o Options) (Rig, error) { return NewRaw(ctx, 2, o) }},
		{"weida", func(o Options) (Rig, error) { return NewWeida(ctx, 2, o) }},
	} {
		for _, count := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/count=%t", rig.name, count), func(t *testing.T) {
				r, err := rig.new(Options{Size: size, Window: 4, CountPackets: count})
				if err != nil {
					t.Fatal(err)
				}
				defer r.Close()
				s, err := r.Run(ctx, Load{Messages: messages})
				if err != nil {
					t.Fatal(err)
				}
				ep, rc := s.EndpointPackets, s.ReceiverPackets
				if !count {
					if ep != (Packets{}) || rc != (Packets{}) {
						t.Errorf("counted without CountPackets: %+v, %+v", ep, rc)
					}
					return
				}
				// Every copy's payload left the sending end in a packet
				// with STREAM frames. (No sum across fields: a packet
				// sent during the closing snapshot may be in one field
				// and not yet in another.)
				if ep.WithStream == 0 || ep.Bytes < size*messages*2 {
					t.Errorf("sending end: %+v", ep)
				}
				// The receivers acknowledged them, and granted new stream
				// credit as they consumed streams (quic-go does at every
				// stream it is done with).
				if rc.Sent == 0 || rc.MaxStreams == 0 {
					t.Errorf("receiving end: %+v", rc)
				}
			})
		}
	}
}

// TestClassifyPackets: a sent packet counts by what it carried, a copy
// before anything else, then a PING, then control frames; an ACK alone
// is AckOnly; MAX_STREAMS frames count one by one.
func TestClassifyPackets(t *testing.T) {
	stream := qlog.Frame{Frame: &qlog.StreamFrame{}}
	ack := qlog.Frame{Frame: &qlog.AckFrame{}}
	ping := qlog.Frame{Frame: &qlog.PingFrame{}}
	maxStreams := qlog.Frame{Frame: &qlog.MaxStreamsFrame{}}
	maxData := qlog.Frame{Frame: &qlog.MaxDataFrame{}}
	for _, c := range []struct {
		name   string
		frames []qlog.Frame
		want   Packets
	}{
		{"a copy", []qlog.Frame{stream}, Packets{WithStream: 1}},
		{"a copy, an ACK, a PING and credit", []qlog.Frame{ack, ping, stream, maxStreams}, Packets{WithStream: 1, MaxStreams: 1}},
		{"an ACK", []qlog.Frame{ack}, Packets{AckOnly: 1}},
		{"a keep-alive", []qlog.Frame{ping}, Packets{PingNoStream: 1}},
		{"a PING with credit", []qlog.Frame{ping, maxStreams}, Packets{PingNoStream: 1, MaxStreams: 1}},
		{"an ACK with credit", []qlog.Frame{ack, maxStreams, maxStreams, maxData}, Packets{MaxStreams: 2}},
		{"nothing", nil, Packets{AckOnly: 1}},
	} {
		var c0 endCounter
		c0.classify(c.frames)
		if got := c0.load(); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
	// Only 1-RTT packets count, sent or lost.
	var e endCounter
	e.RecordEvent(qlog.PacketSent{Header: qlog.PacketHeader{PacketType: qlog.PacketTypeHandshake}, Frames: []qlog.Frame{ack}})
	e.RecordEvent(qlog.PacketSent{Header: qlog.PacketHeader{PacketType: qlog.PacketType1RTT}, Raw: qlog.RawInfo{Length: 1200}, Frames: []qlog.Frame{stream}})
	e.RecordEvent(qlog.PacketLost{Header: qlog.PacketHeader{PacketType: qlog.PacketType1RTT}})
	e.RecordEvent(qlog.PacketLost{Header: qlog.PacketHeader{PacketType: qlog.PacketTypeInitial}})
	if got, want := e.load(), (Packets{Sent: 1, Bytes: 1200, WithStream: 1, Lost: 1}); got != want {
		t.Errorf("events: %+v, want %+v", got, want)
	}
}

// TestProfiledRun: while a rig runs, its CPU profile finds each end's
// share of the work under that rig's labels, and the work of another rig
// running at the same time under neither. The goroutines quic-go and
// package weida start inherit the labels of the goroutine that starts
// them, so a rig that set up one end unlabelled would leave that end's
// connection loops and writers under Runtime and its side with little.
func TestProfiledRun(t *testing.T) {
	if f := flag.Lookup("test.cpuprofile"); f != nil && f.Value.String() != "" {
		t.Skip("-test.cpuprofile holds the one CPU profile a process may run")
	}
	ctx := context.Background()
	raw, err := NewRaw(ctx, 1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	w, err := NewWeida(ctx, 1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	load := Load{Duration: time.Second}
	// Each end does about as much work as the other (measured: a third to a
	// half each, the shared runtime the rest).
	checkEnds := func(name string, c CPU) {
		t.Helper()
		t.Logf("%s: %+v", name, c)
		if c.Rig() < 50*time.Millisecond {
			t.Fatalf("%s: the profile sampled %v of the rig's CPU", name, c.Rig())
		}
		if c.Endpoint < c.Rig()/4 || c.Receiver < c.Rig()/4 {
			t.Errorf("%s: ends %v and %v of %v", name, c.Endpoint, c.Receiver, c.Rig())
		}
	}
	for _, rig := range []Rig{raw, w} {
		_, c, err := ProfiledRun(ctx, rig, load)
		if err != nil {
			t.Fatal(err)
		}
		checkEnds(rig.Name(), c)
	}
	// The weida rig busy beside the raw one: its work is the other rig's.
	busy := make(chan error, 1)
	go func() { _, err := w.Run(ctx, load); busy <- err }()
	_, c, err := ProfiledRun(ctx, raw, load)
	if err := errors.Join(err, <-busy); err != nil {
		t.Fatal(err)
	}
	checkEnds("raw quic-go beside weida", c)
	if c.OtherRigs < (c.Rig()+c.OtherRigs)/5 {
		t.Errorf("the weida rig's work beside the raw one: %v of %v", c.OtherRigs, c.Rig()+c.OtherRigs)
	}
}

func TestRunErrors(t *testing.T) {
	ctx := context.Background()
	w, err := NewWeida(ctx, 1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.Run(ctx, Load{}); err == nil {
		t.Error("Run with an empty load succeeded")
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := w.Run(canceled, Load{Messages: 10_000}); !errors.Is(err, context.Canceled) {
		t.Errorf("Run with a canceled ctx = %v", err)
	}
	if _, err := NewWeida(ctx, 0, Options{}); err == nil {
		t.Error("NewWeida with no subscribers succeeded")
	}
}

func TestCompare(t *testing.T) {
	var calls int
	rep, err := Compare(context.Background(), Plan{
		Options:     Options{Window: 8},
		Load:        Load{Messages: 50},
		Subscribers: []int{1, 2},
		Rounds:      2,
		Progress:    func(round int, rig string, s Sample) { calls++ },
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Series) != 3 || calls != 6 || len(rep.Ratios) != 2 {
		t.Fatalf("report: %d series, %d progress calls, ratios %v", len(rep.Series), calls, rep.Ratios)
	}
	for i, want := range []int{1, 1, 2} {
		s := rep.Series[i]
		if s.Receivers != want || len(s.Samples) != 2 {
			t.Errorf("series %d: %s, %d receivers, %d samples", i, s.Name, s.Receivers, len(s.Samples))
		}
		for _, x := range s.Samples {
			if x.Messages != 50 || x.Copies != 50*int64(want) {
				t.Errorf("series %s: sample %+v", s.Name, x)
			}
		}
	}
	if one, ok := rep.Single(); !ok || one.Name != "weida, 1 subscriber" {
		t.Errorf("Single = %v, %v", one.Name, ok)
	}
	if _, ok := rep.CPURatio(); !ok && proccpu.Self() > 0 {
		t.Error("no CPU ratio although the platform reports CPU time")
	}

	rep, err = Compare(context.Background(), Plan{Load: Load{Messages: 10}, Subscribers: []int{2}, Rounds: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Ratios) != 0 {
		t.Errorf("ratios without a one-subscriber rig: %v", rep.Ratios)
	}
	if _, ok := rep.CPURatio(); ok {
		t.Error("CPU ratio without a one-subscriber rig")
	}
	if _, err := Compare(context.Background(), Plan{Rounds: -1}); err == nil {
		t.Error("negative rounds accepted")
	}
}

// TestSampleOrder: each rig once per round, raw quic-go and the
// one-subscriber rig adjacent and alternating, the others rotating.
func TestSampleOrder(t *testing.T) {
	for _, tc := range []struct {
		round, rigs, single int
		want                []int
	}{
		{0, 4, 1, []int{0, 1, 2, 3}},
		{1, 4, 1, []int{1, 0, 3, 2}},
		{2, 4, 1, []int{0, 1, 2, 3}},
		{0, 4, 2, []int{0, 2, 1, 3}},
		{1, 3, -1, []int{0, 2, 1}},
		{0, 1, -1, []int{0}},
		{3, 2, 1, []int{1, 0}},
	} {
		if got := sampleOrder(tc.round, tc.rigs, tc.single); !slices.Equal(got, tc.want) {
			t.Errorf("sampleOrder(%d, %d, %d) = %v, want %v", tc.round, tc.rigs, tc.single, got, tc.want)
		}
	}
	rapid.Check(t, func(t *rapid.T) {
		rigs := rapid.IntRange(1, 8).Draw(t, "rigs")
		single := -1
		if rigs > 1 && rapid.Bool().Draw(t, "hasSingle") {
			single = rapid.IntRange(1, rigs-1).Draw(t, "single")
		}
		round := rapid.IntRange(0, 20).Draw(t, "round")
		got := sampleOrder(round, rigs, single)
		sorted := slices.Sorted(slices.Values(got))
		for i, v := range sorted {
			if v != i {
				t.Fatalf("order %v is not a permutation of %d rigs", got, rigs)
			}
		}
		if single > 0 {
			a, b := slices.Index(got, 0), slices.Index(got, single)
			if a+b != 1 {
				t.Fatalf("order %v does not start with raw and single", got)
			}
		}
	})
}
