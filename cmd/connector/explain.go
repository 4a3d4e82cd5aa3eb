package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"

	"weida.dev/connector/policy"
	"weida.dev/connector/service"
)

// exitRefused is explain's exit code when at least one input was refused.
const exitRefused = 3

// explainSynopsis is the usage text; the protocols and their settings
// come from ds.
func explainSynopsis(ds []service.Driver) string {
	names := make([]string, len(ds))
	for i, d := range ds {
		names[i] = string(d.Name())
	}
	settings := ""
	for _, s := range settingFlags(ds) {
		if s.Bool {
			settings += fmt.Sprintf(" [--%s]", s.Name)
		} else {
			settings += fmt.Sprintf(" [--%s %s]", s.Name, s.Values)
		}
	}
	return `connector explain --protocol ` + strings.Join(names, "|") + ` [--policy NAME] [--direction inbound|outbound]
           [--mount-foreign PREFIX] [--mount-weida PREFIX]
           (--filter F | --topic T)... [--output text|json]` + settings + explainHelp
}

// settingFlag is one policy setting flag and the protocols that have it.
type settingFlag struct {
	policy.Setting
	protocols []string
}

// settingFlags merges the settings of ds by flag name, in order.
func settingFlags(ds []service.Driver) []settingFlag {
	var out []settingFlag
	for _, d := range ds {
	next:
		for _, s := range d.Settings() {
			for i := range out {
				if out[i].Name == s.Name {
					out[i].protocols = append(out[i].protocols, string(d.Name()))
					continue next
				}
			}
			out = append(out, settingFlag{s, []string{string(d.Name())}})
		}
	}
	return out
}

const explainHelp = `

Shows how each filter and topic converts under a conversion policy, or why it
is refused. A --filter is always a filter of the broker's protocol and
becomes a weida filter. With --direction inbound (the default) a --topic is a
broker topic converted to weida's grammar; with --direction outbound it is a
weida topic converted to the broker's grammar. --filter and --topic may be
repeated and mixed; the answers keep their order.

With --mount-foreign and --mount-weida (either may be left out, meaning no
prefix on that side) the conversion is the one a resource with
spec.conversion.mount gets: a filter or topic outside the foreign prefix is
refused, and what is inside moves under the weida prefix.

Losses: a converted input lists what a bridge with this policy, direction
and options loses; a refused topic lists the loss it is counted under at run
time; a refused filter lists none (the resource would not load).

Exit status: 0 when every input converted, 3 when any was refused, 2 on a
usage error. With --output json, one JSON object per input, one per line.`

// explainInput is one --filter or --topic, in command-line order.
type explainInput struct {
	kind  string // "filter" or "topic"
	value string
}

// inputFlag appends to a shared list, so that --filter and --topic keep
// their relative order.
type inputFlag struct {
	kind string
	list *[]explainInput
}

func (f inputFlag) String() string { return "" }
func (f inputFlag) Set(v string) error {
	*f.list = append(*f.list, explainInput{f.kind, v})
	return nil
}

// explainResult is one answer; its JSON form is the --output json line.
type explainResult struct {
	Input     string        `json:"input"`
	Kind      string        `json:"kind"`
	Protocol  string        `json:"protocol"`
	Policy    string        `json:"policy"`
	Mount     *mountJSON    `json:"mount,omitempty"`
	Direction string        `json:"direction"`
	Output    *string       `json:"output,omitempty"`
	Refused   bool          `json:"refused"`
	Reason    string        `json:"reason"`
	Rule      string        `json:"rule"`
	Part      *string       `json:"part,omitempty"`
	Hint      string        `json:"hint,omitempty"`
	Losses    []policy.Loss `json:"losses"`
	// DropReason is, for a refused topic, the reason label the runtime
	// counts the dropped message under (the refusal's rule) in
	// weida_connector_messages_dropped_total and /status.
	DropReason string `json:"dropReason,omitempty"`
}

// explainFlags are explain's flags as parsed, before they are checked.
type explainFlags struct {
	proto, policy, direction, output string
	mountForeign, mountWeida         string
	inputs                           []explainInput
	settings                         []settingFlag
	given                            map[string]string // setting flags given, by name
}

// explainRun is what the checked flags ask for.
type explainRun struct {
	drv    service.Driver
	pol    policy.Policy
	mount  *mountJSON
	dir    policy.Direction
	opts   policy.Options
	inputs []explainInput
	json   bool
}

func cmdExplain(_ context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) int {
	ds := programDrivers()
	fs := newFlagSet("explain", explainSynopsis(ds), stderr)
	f := defineExplainFlags(fs, ds)
	if code, done := parseFlags(fs, args, stdout); done {
		return code
	}
	// The flag package stops at the first argument that is not a flag, so a
	// --help after one would otherwise read as a stray argument.
	for _, a := range fs.Args() {
		if a == "-h" || a == "-help" || a == "--help" {
			fs.SetOutput(stdout)
			fs.Usage()
			return exitOK
		}
	}
	if fs.NArg() > 0 {
		return explainUsageError(stderr, fmt.Errorf("unexpected argument %q: give each input with --filter or --topic", fs.Arg(0)))
	}
	run, err := f.check(ds)
	if err != nil {
		return explainUsageError(stderr, err)
	}
	return run.write(stdout, stderr)
}

// explainUsageError reports a usage error and returns its exit status.
func explainUsageError(stderr io.Writer, err error) int {
	fmt.Fprintf(stderr, "connector explain: %v\n", err)
	fmt.Fprintln(stderr, "Run 'connector explain --help' for usage.")
	return exitUsage
}

// defineExplainFlags defines explain's flags on fs; the protocols, default
// policies and setting flags come from ds.
func defineExplainFlags(fs *flag.FlagSet, ds []service.Driver) *explainFlags {
	f := &explainFlags{settings: settingFlags(ds), given: map[string]string{}}
	protoNames, defaults := make([]string, len(ds)), make([]string, len(ds))
	for i, d := range ds {
		protoNames[i], defaults[i] = string(d.Name()), d.Policies()[0].Name()
	}
	fs.StringVar(&f.proto, "protocol", "", "the broker's protocol: "+orList(protoNames)+" (required)")
	fs.StringVar(&f.policy, "policy", "", "the conversion policy (default: "+orList(defaults)+" by protocol)")
	fs.StringVar(&f.direction, "direction", string(policy.Inbound), "inbound (broker → weida) or outbound (weida → broker)")
	fs.Var(inputFlag{"filter", &f.inputs}, "filter", "a broker filter to convert to weida's grammar; repeatable")
	fs.Var(inputFlag{"topic", &f.inputs}, "topic", "a topic to convert: a broker topic inbound, a weida topic outbound; repeatable")
	fs.StringVar(&f.output, "output", "text", "output format: text or json")
	fs.StringVar(&f.mountForeign, "mount-foreign", "", "mount: the broker's prefix, ending with its separator (factory/); default none")
	fs.StringVar(&f.mountWeida, "mount-weida", "", "mount: the weida prefix, ending with '.' (plants.berlin.); default none")
	for _, s := range f.settings {
		usage := strings.ToUpper(strings.Join(s.protocols, ", ")) + " only: " + s.Usage
		set := func(v string) error { f.given[s.Name] = v; return nil }
		if s.Bool {
			fs.BoolFunc(s.Name, usage, set)
		} else {
			fs.Func(s.Name, usage+" (default "+s.Default+")", set)
		}
	}
	return f
}

// check turns the flags into a run, or says what is wrong with them: the
// protocol, the policy and its mount, the direction and output, the
// settings, and that there is something to explain, in that order.
func (f *explainFlags) check(ds []service.Driver) (explainRun, error) {
	var run explainRun
	var err error
	if run.drv, run.pol, err = f.policyOf(ds); err != nil {
		return run, err
	}
	if m := (policy.Mount{Foreign: f.mountForeign, Weida: f.mountWeida}); m != (policy.Mount{}) {
		mp, err := policy.NewMounted(run.pol, m)
		if err != nil {
			return run, fmt.Errorf("cannot mount %q at %q: %v", m.Foreign, m.Weida, err)
		}
		run.pol, run.mount = mp, &mountJSON{m.Foreign, m.Weida}
	}
	run.dir = policy.Direction(f.direction)
	if run.dir != policy.Inbound && run.dir != policy.Outbound {
		return run, fmt.Errorf("--direction must be inbound or outbound, not %q", f.direction)
	}
	if f.output != "text" && f.output != "json" {
		return run, fmt.Errorf("--output must be text or json, not %q", f.output)
	}
	run.json = f.output == "json"
	if run.opts, err = f.options(string(run.drv.Name())); err != nil {
		return run, err
	}
	if len(f.inputs) == 0 {
		return run, errors.New("nothing to explain: give at least one --filter or --topic")
	}
	run.inputs = f.inputs
	return run, nil
}

// policyOf returns the driver of --protocol and the policy to explain:
// --policy, which must be one of that protocol's, or the protocol's
// default.
func (f *explainFlags) policyOf(ds []service.Driver) (service.Driver, policy.Policy, error) {
	protoNames := make([]string, len(ds))
	for i, d := range ds {
		protoNames[i] = string(d.Name())
	}
	if f.proto == "" {
		return nil, nil, fmt.Errorf("--protocol is required (%s)", orList(protoNames))
	}
	drv := service.Lookup(ds, f.proto)
	if drv == nil {
		return nil, nil, fmt.Errorf("--protocol must be %s, not %q", orList(protoNames), f.proto)
	}
	p, def := drv.Name(), drv.Policies()[0]
	if f.policy == "" {
		return drv, def, nil
	}
	all := service.Policies(ds)
	pol, err := policy.Lookup(all, f.policy)
	if err != nil {
		return nil, nil, fmt.Errorf("unknown --policy %q; known policies: %s", f.policy, strings.Join(policy.Names(all), ", "))
	}
	if pol.Protocol() != p {
		return nil, nil, fmt.Errorf("policy %s is for %s, not %s (the %s default is %s)", pol.Name(), pol.Protocol(), p, p, def.Name())
	}
	return drv, pol, nil
}

// options applies the setting flags of protocol (given or their defaults)
// and refuses one given for another protocol.
func (f *explainFlags) options(protocol string) (policy.Options, error) {
	var opts policy.Options
	for _, s := range f.settings {
		v, set := f.given[s.Name]
		if !slices.Contains(s.protocols, protocol) {
			if set {
				return opts, fmt.Errorf("--%s applies to %s only", s.Name, strings.Join(s.protocols, " and "))
			}
			continue
		}
		if !set {
			v = s.Default
		}
		if err := s.Apply(&opts, v); err != nil {
			return opts, fmt.Errorf("--%s %v", s.Name, err)
		}
	}
	return opts, nil
}

// write explains every input to stdout and returns the exit status:
// exitRefused when any input was refused.
func (run explainRun) write(stdout, stderr io.Writer) int {
	results := make([]explainResult, len(run.inputs))
	refused := false
	for i, in := range run.inputs {
		results[i] = explainOne(run.pol, run.dir, run.opts, in)
		results[i].Mount = run.mount
		refused = refused || results[i].Refused
	}
	if run.json {
		enc := json.NewEncoder(stdout)
		for _, r := range results {
			if err := enc.Encode(r); err != nil {
				fmt.Fprintf(stderr, "connector explain: %v\n", err)
				return exitFailure
			}
		}
	} else {
		writeExplainText(stdout, run.pol, run.drv.DescribeOptions(run.opts), run.dir, run.opts, results)
	}
	if refused {
		return exitRefused
	}
	return exitOK
}

func explainOne(pol policy.Policy, d policy.Direction, opts policy.Options, in explainInput) explainResult {
	r := explainResult{
		Input: in.value, Kind: in.kind, Protocol: string(pol.Protocol()),
		Policy: pol.Name(), Direction: string(d), Losses: []policy.Loss{},
	}
	var out string
	var err error
	switch {
	case in.kind == "filter":
		out, err = pol.ConvertFilter(in.value)
	case d == policy.Inbound:
		out, err = pol.TopicToWeida(in.value)
	default:
		out, err = pol.TopicFromWeida(in.value)
	}
	if err == nil {
		r.Output = &out
		r.Losses = pol.Losses(d, opts)
		return r
	}
	r.Refused = true
	var ref *policy.Refusal
	if !errors.As(err, &ref) {
		r.Reason = err.Error() // the policy contract says this does not happen
		return r
	}
	r.Reason, r.Rule, r.Hint = ref.Reason, ref.Rule, ref.Hint
	if ref.Part != "" || ref.Input == "" {
		part := ref.Part
		r.Part = &part
	}
	if in.kind == "topic" {
		if l, ok := pol.LossFor(ref.Rule); ok {
			r.Losses = []policy.Loss{l}
		}
		// The runtime counts a refused topic under the refusal's rule
		// (connectors' refusalRule), not under the loss's name.
		r.DropReason = ref.Rule
	}
	return r
}

// writeExplainText prints a header naming the conversion, one block per
// input, and the losses with their meaning once at the end. Inputs and
// outputs are quoted so that empty strings and spaces show.
func writeExplainText(w io.Writer, pol policy.Policy, settings string, d policy.Direction, opts policy.Options, results []explainResult) {
	proto := strings.ToUpper(string(pol.Protocol()))
	from, to := proto, "weida"
	if d == policy.Outbound {
		from, to = "weida", proto
	}
	fmt.Fprintf(w, "%s", pol.Name())
	if mp, ok := pol.(*policy.Mounted); ok {
		m := mp.Mount()
		fmt.Fprintf(w, " mounting %s %q at weida %q", proto, m.Foreign, m.Weida)
	}
	fmt.Fprintf(w, ", %s", d)
	if settings != "" {
		fmt.Fprintf(w, ", %s", settings)
	}
	fmt.Fprintf(w, ": filters %s → weida, topics %s → %s\n\n", proto, from, to)

	converted := false
	for _, r := range results {
		fmt.Fprintf(w, "%-6s %q\n", r.Kind, r.Input)
		if !r.Refused {
			converted = true
			fmt.Fprintf(w, "       → %q\n", *r.Output)
			continue
		}
		fmt.Fprintf(w, "       refused [%s]", r.Rule)
		if r.Part != nil && *r.Part != r.Input {
			fmt.Fprintf(w, " at %q", *r.Part)
		}
		fmt.Fprintf(w, ": %s\n", r.Reason)
		if r.Hint != "" {
			fmt.Fprintf(w, "       hint: %s\n", r.Hint)
		}
		if r.DropReason != "" {
			fmt.Fprintf(w, "       at run time: dropped and counted under reason %s", r.DropReason)
			if len(r.Losses) > 0 {
				fmt.Fprintf(w, " (the declared loss %s)", r.Losses[0])
			}
			fmt.Fprintf(w, "\n")
		}
	}
	if !converted {
		return
	}
	losses := pol.Losses(d, opts)
	under := ""
	if _, ok := pol.(*policy.Mounted); ok {
		under = " under this mount"
	}
	fmt.Fprintf(w, "\nlosses of %s %s%s (declare them in the resource):\n", pol.Name(), d, under)
	width := 0
	for _, l := range losses {
		width = max(width, len(l))
	}
	for _, l := range losses {
		fmt.Fprintf(w, "  %-*s  %s\n", width, l, l.Description())
	}
}

// orList joins names as a sentence does: "a, b or c".
func orList(names []string) string {
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}
