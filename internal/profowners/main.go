// Command profowners splits a CPU profile of a bridge benchmark rig by
// owner: the connector's own code, the broker client library, the weida
// peer, the Go runtime's garbage collector and scheduler, and the rig
// harness. docs/PERFORMANCE.md ("Where the excess goes") uses it to turn
// the difference between a bridged rig and its direct rigs into
// microseconds per message, part by part.
//
// It reads the text of `go tool pprof -traces` (one block per stack, the
// leaf first):
//
//	go tool pprof -traces e2e.test nats-out.prof > nats-out.traces
//	go run ./internal/profowners -cpu 9.38 nats-out.traces
//
// where -cpu is the rig's CPU per message in the test process, in µs
// (scripts/bench-bridge logs it per round), so that each owner's share of
// the samples becomes µs per message.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Owners, in the order they are printed.
const (
	ownerConnector = "connector"
	ownerClient    = "broker client"
	ownerWeida     = "weida peer"
	ownerGC        = "runtime: GC"
	ownerSched     = "runtime: scheduler"
	ownerRig       = "rig harness"
	ownerOther     = "other"
)

var owners = []string{ownerConnector, ownerClient, ownerWeida, ownerGC, ownerSched, ownerRig, ownerOther}

// gcFrames anywhere in a stack make the sample the collector's: marking,
// sweeping, assists, write barriers, and the span refills that sweep.
var gcFrames = map[string]bool{
	"runtime.gcBgMarkWorker": true, "runtime.gcAssistAlloc": true, "runtime.bgsweep": true,
	"runtime.bgscavenge": true, "runtime.gcDrain": true, "runtime.wbBufFlush": true,
	"runtime.wbBufFlush1": true, "gcWriteBarrier": true, "runtime.deductSweepCredit": true,
	"runtime.sweepone": true, "runtime.gcStart": true, "runtime.markroot": true,
	"runtime.gcMarkDone": true, "runtime.gcMarkTermination": true,
	"runtime.(*mheap).alloc": true, "runtime.(*mcache).refill": true,
}

// wakeFrames make a sample the scheduler's even under a caller's frame: the
// cost of waking another goroutine is the hand-off's, not the caller's
// own work.
var wakeFrames = map[string]bool{
	"runtime.wakep": true, "runtime.ready": true, "runtime.goready": true,
	"runtime.notewakeup": true, "runtime.startm": true,
}

// ownerOf names the owner of a function outside the runtime and the
// standard library, or "" for those.
func ownerOf(fn string) string {
	switch {
	case strings.Contains(fn, "ufferedConn)."):
		// The MQTT clients' socket wrappers (connectors/mqtt's and the
		// e2e rigs'): one write(2) per packet, client work in either rig.
		return ownerClient
	case strings.HasPrefix(fn, "weida.dev/connector/e2e."),
		strings.HasPrefix(fn, "weida.dev/connector/connectors/conntest."):
		return ownerRig
	case strings.HasPrefix(fn, "weida.dev/connector/connectors"),
		strings.HasPrefix(fn, "github.com/prometheus/"):
		return ownerConnector
	case strings.HasPrefix(fn, "weida.dev/connector/weida"),
		strings.HasPrefix(fn, "github.com/quic-go/"),
		strings.HasPrefix(fn, "golang.org/x/net/"): // quic-go's batched UDP I/O
		return ownerWeida
	case strings.HasPrefix(fn, "github.com/nats-io/"),
		strings.HasPrefix(fn, "github.com/eclipse/paho"),
		strings.HasPrefix(fn, "github.com/rabbitmq/amqp091-go"):
		return ownerClient
	case strings.HasPrefix(fn, "weida.dev/"):
		return ownerConnector
	case strings.Contains(fn, "/") && strings.Contains(strings.SplitN(fn, "/", 2)[0], "."):
		return ownerOther // another module
	}
	return ""
}

// classify returns a stack's owner and, for the connector, the function
// that stands for it (the innermost of the connector's own).
func classify(stack []string) (owner, fn string) {
	for _, f := range stack {
		if gcFrames[f] {
			return ownerGC, ""
		}
	}
	for _, f := range stack {
		if wakeFrames[f] {
			return ownerSched, ""
		}
	}
	for _, f := range stack {
		if o := ownerOf(f); o != "" {
			return o, f
		}
	}
	if strings.HasPrefix(stack[len(stack)-1], "runtime.") {
		return ownerSched, "" // a runtime-only stack: scheduling, the netpoller, sysmon
	}
	return ownerOther, ""
}

var sampleLine = regexp.MustCompile(`^\s+([0-9.]+)(s|ms|us|µs|ns)\s+(\S+)`)

// parseTraces reads `go tool pprof -traces` output into stacks (leaf
// first) with their sample time in ms.
func parseTraces(r io.Reader) (stacks [][]string, ms []float64, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var cur []string
	flush := func() {
		if cur != nil {
			stacks = append(stacks, cur)
		}
		cur = nil
	}
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "-----") {
			flush()
			continue
		}
		if m := sampleLine.FindStringSubmatch(line); m != nil {
			flush()
			v, err := strconv.ParseFloat(m[1], 64)
			if err != nil {
				return nil, nil, err
			}
			v *= map[string]float64{"s": 1e3, "ms": 1, "us": 1e-3, "µs": 1e-3, "ns": 1e-6}[m[2]]
			ms = append(ms, v)
			cur = []string{m[3]}
			continue
		}
		if cur != nil {
			if f := strings.Fields(line); len(f) > 0 {
				cur = append(cur, f[0])
			}
		}
	}
	flush()
	if len(stacks) != len(ms) {
		return nil, nil, fmt.Errorf("profowners: %d stacks for %d sample lines", len(stacks), len(ms))
	}
	return stacks, ms, sc.Err()
}

func main() {
	cpu := flag.Float64("cpu", 1, "the rig's CPU per message in the test process, µs (1: print shares)")
	top := flag.Int("top", 12, "connector functions to list")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: profowners -cpu µs TRACES (the output of go tool pprof -traces)")
		os.Exit(2)
	}
	f, err := os.Open(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer f.Close()
	stacks, ms, err := parseTraces(f)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var total float64
	byOwner := map[string]float64{}
	byFn := map[string]float64{}
	for i, st := range stacks {
		o, fn := classify(st)
		byOwner[o] += ms[i]
		if o == ownerConnector {
			byFn[fn] += ms[i]
		}
		total += ms[i]
	}
	if total == 0 {
		fmt.Fprintln(os.Stderr, "profowners: no samples")
		os.Exit(1)
	}
	fmt.Printf("%d samples (%.2f s of CPU); µs per message at %.2f µs in the process\n", int(total/10+0.5), total/1e3, *cpu)
	for _, o := range owners {
		fmt.Printf("%-20s %5.1f%% %7.2f µs\n", o, 100*byOwner[o]/total, *cpu*byOwner[o]/total)
	}
	fns := make([]string, 0, len(byFn))
	for fn := range byFn {
		fns = append(fns, fn)
	}
	slices.SortFunc(fns, func(a, b string) int {
		if byFn[a] != byFn[b] {
			if byFn[a] > byFn[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	for _, fn := range fns[:min(*top, len(fns))] {
		fmt.Printf("  %-70s %7.2f µs\n", fn, *cpu*byFn[fn]/total)
	}
}
