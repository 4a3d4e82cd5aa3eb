package weidacli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"weida.dev/connector/internal/cli"
	"weida.dev/connector/weida"
	"weida.dev/connector/weida/bench"
)

const benchSynopsis = `connector weida bench [--duration 1s | --messages N] [--size 256]
           [--subscribers 1,10,100] [--rounds 5] [--output text|json]

Measures, in one process over 127.0.0.1, how fast package weida delivers
messages, against raw quic-go doing the same stream work without weida:
per message, open a uni stream, write the same bytes (the DATA preamble and
header a weida publisher writes, and the payload), FIN; the other side
accepts each stream and reads it to its FIN. The weida rigs publish to 1, 10
and 100 subscribers that call Receive. At most --window copies are in
flight per receiver, so that nothing is dropped.

Every rig takes one sample per round, and the report gives medians over the
rounds: the machine may be shared and noisy, and alternating spreads its
drift over every rig. Raw quic-go and weida with one subscriber run back to
back, each first in every other round, and their ratio is taken per round. CPU time is the
user and system time of the whole process (both ends) per copy received,
which varies less than the rates. The goal is a median ratio of 85% or
more.

Progress goes to stderr (unless --quiet), the report to stdout. The exit
status is 0 whether or not the goal is met; 1 when a measurement fails; 2 on
a usage error.`

// benchGoal is the share of raw quic-go's rate weida aims for (issue 2).
const benchGoal = 0.85

func cmdBench(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("weida bench", benchSynopsis, stderr)
	duration := fs.Duration("duration", time.Second, "length of one sample")
	messages := fs.Int64("messages", 0, "messages per sample instead of --duration (with both, whichever ends first)")
	size := fs.Int("size", bench.DefaultSize, "payload bytes per message")
	subsFlag := fs.String("subscribers", "1,10,100", "comma-separated subscriber counts of the weida rigs; 1 is compared with raw quic-go")
	rounds := fs.Int("rounds", 5, "samples per rig")
	window := fs.Int("window", bench.DefaultWindow, "copies in flight per receiver")
	output := fs.String("output", "text", "report format: text or json")
	quiet := fs.Bool("quiet", false, "no progress lines on stderr")
	pos, code, done := parseInterspersed(fs, args, stdout)
	if done {
		return code
	}
	bad := func(format string, a ...any) int { return usageError(stderr, "bench", format, a...) }
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	load := bench.Load{Messages: *messages, Duration: *duration}
	if set["messages"] && !set["duration"] {
		load.Duration = 0
	}
	subs, err := parseCounts(*subsFlag)
	if len(pos) > 0 {
		return bad("unexpected argument %q", pos[0])
	}
	if err != nil {
		return bad("--subscribers: %v", err)
	}
	if msg := benchFlagProblem(load, *messages, *duration, *size, *rounds, *window, *output); msg != "" {
		return bad("%s", msg)
	}

	plan := bench.Plan{
		Options:     bench.Options{Size: *size, Window: *window},
		Load:        load,
		Subscribers: subs,
		Rounds:      *rounds,
	}
	if !*quiet {
		fmt.Fprintf(stderr, "connector weida bench: %s of %d rigs, %s per sample\n", countOf(*rounds, "round", "rounds"), 1+len(subs), describeLoad(load))
		plan.Progress = func(round int, rig string, s bench.Sample) {
			fmt.Fprintf(stderr, "round %d/%d  %-24s %10s msgs/s %10s copies/s %8s CPU/copy\n", round, *rounds,
				rig, thousands(s.MessagesPerSecond()), thousands(s.CopiesPerSecond()), micros(s.CPUPerCopy()))
		}
	}
	rep, err := bench.Compare(ctx, plan)
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(stderr, "connector weida bench: interrupted")
		} else {
			fmt.Fprintf(stderr, "connector weida bench: %v\n", err)
		}
		return cli.ExitFailure
	}
	if *output == "json" {
		return writeBenchJSON(stdout, stderr, rep)
	}
	writeBenchText(stdout, rep)
	return cli.ExitOK
}

// benchFlagProblem says what is wrong with bench's numeric and format
// flags, or returns "" when they describe a measurement that can run.
func benchFlagProblem(load bench.Load, messages int64, duration time.Duration, size, rounds, window int, output string) string {
	switch {
	case messages < 0 || duration < 0 || (load.Messages == 0 && load.Duration == 0):
		return "give a positive --duration or --messages"
	case size < 1:
		return "--size must be at least 1"
	case rounds < 1:
		return "--rounds must be at least 1"
	case window < 1:
		return "--window must be at least 1"
	case int64(window)*int64(len(bench.Frame(size))) > weida.DefaultSubscriberBufferBytes:
		return fmt.Sprintf("--window %d of %d-byte messages exceeds the subscriber budget of %d bytes; the publisher would drop copies",
			window, size, weida.DefaultSubscriberBufferBytes)
	case output != "text" && output != "json":
		return fmt.Sprintf("--output must be text or json, not %q", output)
	}
	return ""
}

func writeBenchJSON(stdout, stderr io.Writer, rep *bench.Report) int {
	out, err := marshalJSONLine(benchJSONReport(rep))
	if err == nil {
		_, err = stdout.Write(out)
	}
	if err != nil {
		fmt.Fprintf(stderr, "connector weida bench: %v\n", err)
		return cli.ExitFailure
	}
	return cli.ExitOK
}

// parseCounts reads "1,10,100": positive, distinct integers.
func parseCounts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive count", f)
		}
		if slices.Contains(out, n) {
			return nil, fmt.Errorf("%d given twice", n)
		}
		out = append(out, n)
	}
	return out, nil
}

func describeLoad(l bench.Load) string {
	switch {
	case l.Messages > 0 && l.Duration > 0:
		return fmt.Sprintf("%d messages or %v", l.Messages, l.Duration)
	case l.Messages > 0:
		return fmt.Sprintf("%d messages", l.Messages)
	}
	return l.Duration.String()
}

func writeBenchText(w io.Writer, rep *bench.Report) {
	fmt.Fprintf(w, "weida against raw quic-go over 127.0.0.1: %d-byte payloads, %s of %s per rig, window %d\n",
		rep.Options.Size, countOf(rep.Rounds, "round", "rounds"), describeLoad(rep.Load), rep.Options.Window)
	fmt.Fprintln(w, "medians over the rounds; CPU is user+system time of the whole process (both ends) per copy received")
	fmt.Fprintln(w)
	rows := [][]string{{"rig", "msgs/s", "copies/s", "CPU/copy", "allocs/copy"}}
	for _, s := range rep.Series {
		rows = append(rows, []string{s.Name,
			thousands(s.Median(bench.Sample.MessagesPerSecond)),
			thousands(s.Median(bench.Sample.CopiesPerSecond)),
			micros(time.Duration(s.Median(func(x bench.Sample) float64 { return float64(x.CPUPerCopy()) }))),
			fmt.Sprintf("%.1f", s.Median(bench.Sample.AllocsPerCopy))})
	}
	writeTable(w, rows)
	fmt.Fprintln(w)
	if len(rep.Ratios) == 0 {
		fmt.Fprintln(w, "no ratio: add 1 to --subscribers to compare weida with raw quic-go")
		return
	}
	med := bench.Median(rep.Ratios)
	fmt.Fprintf(w, "weida, 1 subscriber / raw quic-go: %.0f%% of the rate (per round: %s)", 100*med, percents(rep.Ratios))
	if c, ok := rep.CPURatio(); ok {
		fmt.Fprintf(w, "; %.0f%% of its CPU efficiency", 100*c)
	}
	fmt.Fprintln(w)
	verdict := "met"
	if med < benchGoal {
		verdict = "NOT met"
	}
	fmt.Fprintf(w, "goal: at least %.0f%% of raw quic-go's rate: %s\n", 100*benchGoal, verdict)
}

// benchJSON is the --output json report.
type benchJSON struct {
	Size            int               `json:"size"`
	Window          int               `json:"window"`
	Rounds          int               `json:"rounds"`
	Messages        int64             `json:"messages"`
	DurationSeconds float64           `json:"durationSeconds"`
	Series          []benchJSONSeries `json:"series"`
	Ratios          []float64         `json:"ratios"`             // per round: weida 1 subscriber / raw quic-go, by rate
	Ratio           *float64          `json:"ratio,omitempty"`    // their median
	CPURatio        *float64          `json:"cpuRatio,omitempty"` // raw CPU per copy / weida CPU per copy, medians
	Goal            float64           `json:"goal"`
	GoalMet         *bool             `json:"goalMet,omitempty"`
}

type benchJSONSeries struct {
	Name              string            `json:"name"`
	Receivers         int               `json:"receivers"`
	MessagesPerSecond float64           `json:"messagesPerSecond"` // medians
	CopiesPerSecond   float64           `json:"copiesPerSecond"`
	CPUPerCopyNanos   float64           `json:"cpuPerCopyNanos"`
	AllocsPerCopy     float64           `json:"allocsPerCopy"`
	Samples           []benchJSONSample `json:"samples"`
}

type benchJSONSample struct {
	Messages       int64   `json:"messages"`
	Copies         int64   `json:"copies"`
	ElapsedSeconds float64 `json:"elapsedSeconds"`
	CPUSeconds     float64 `json:"cpuSeconds"`
	Allocs         uint64  `json:"allocs"`
}

func benchJSONReport(rep *bench.Report) benchJSON {
	j := benchJSON{
		Size: rep.Options.Size, Window: rep.Options.Window, Rounds: rep.Rounds,
		Messages: rep.Load.Messages, DurationSeconds: rep.Load.Duration.Seconds(),
		Ratios: append([]float64{}, rep.Ratios...), Goal: benchGoal,
	}
	for _, s := range rep.Series {
		js := benchJSONSeries{
			Name: s.Name, Receivers: s.Receivers,
			MessagesPerSecond: s.Median(bench.Sample.MessagesPerSecond),
			CopiesPerSecond:   s.Median(bench.Sample.CopiesPerSecond),
			CPUPerCopyNanos:   s.Median(func(x bench.Sample) float64 { return float64(x.CPUPerCopy()) }),
			AllocsPerCopy:     s.Median(bench.Sample.AllocsPerCopy),
		}
		for _, x := range s.Samples {
			js.Samples = append(js.Samples, benchJSONSample{x.Messages, x.Copies, x.Elapsed.Seconds(), x.CPU.Seconds(), x.Allocs})
		}
		j.Series = append(j.Series, js)
	}
	if len(rep.Ratios) > 0 {
		med := bench.Median(rep.Ratios)
		met := med >= benchGoal
		j.Ratio, j.GoalMet = &med, &met
	}
	if c, ok := rep.CPURatio(); ok {
		j.CPURatio = &c
	}
	return j
}

// writeTable prints rows in columns, the first left-aligned and the others
// right-aligned.
func writeTable(w io.Writer, rows [][]string) {
	width := make([]int, len(rows[0]))
	for _, r := range rows {
		for i, c := range r {
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	for _, r := range rows {
		var b strings.Builder
		for i, c := range r {
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(c))
			if i == 0 {
				b.WriteString(c + pad)
			} else {
				b.WriteString("  " + pad + c)
			}
		}
		fmt.Fprintln(w, b.String())
	}
}

// thousands formats a rate as a whole number with thousands separators.
func thousands(v float64) string {
	s := strconv.FormatInt(int64(v+0.5), 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func micros(d time.Duration) string {
	if d <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1fµs", float64(d)/float64(time.Microsecond))
}

func percents(v []float64) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprintf("%.0f%%", 100*x)
	}
	return strings.Join(s, " ")
}
