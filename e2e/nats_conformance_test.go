package e2e

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/policy"
	"weida.dev/connector/weida/topic"
)

// Token classes the generator draws from, biased to the edges of the NATS
// grammar and of its conversion to weida: weida's '#' and wildcard
// characters inside tokens, '$' names, non-ASCII, invalid UTF-8, whitespace
// the protocol splits on and whitespace it does not (form feed, no-break
// space), an empty token, and long tokens that push a subject past weida's
// 256 bytes.
var (
	natsCommon = []string{"a", "b", "c"}
	natsEdge   = []string{
		"#", "*b", "b*", "b#", "#b", "**", ">>", "a>", "$SYS", "$x", "$", "_INBOX", "A",
		"é", "café", "日本", "\u00a0", "\xff", "a\x00b", "\f", "-", "0", "%2E",
		strings.Repeat("l", 120), strings.Repeat("m", 250),
	}
	natsInvalid = []string{"", "a b", "a\tb"}
)

func pick(r *rand.Rand, from []string) string { return from[r.IntN(len(from))] }

// natsLiteral draws a literal token: mostly common, often an edge, rarely
// invalid; '*' and '>' appear as literal tokens of subjects, which the
// server routes as such.
func natsLiteral(r *rand.Rand, wildcardsToo bool) string {
	switch n := r.IntN(100); {
	case n < 55:
		return pick(r, natsCommon)
	case n < 90:
		return pick(r, natsEdge)
	case n < 95 && wildcardsToo:
		return pick(r, []string{"*", ">"})
	default:
		return pick(r, natsInvalid)
	}
}

// genNATSFilter draws 1 to 4 tokens, a quarter of them '*', and often a
// final '>'.
func genNATSFilter(r *rand.Rand) string {
	n := 1 + r.IntN(4)
	toks := make([]string, n)
	for i := range toks {
		switch k := r.IntN(100); {
		case k < 25:
			toks[i] = "*"
		case k < 30:
			toks[i] = ">"
		default:
			toks[i] = natsLiteral(r, false)
		}
	}
	if r.IntN(5) == 0 {
		toks[n-1] = ">"
	}
	return strings.Join(toks, ".")
}

// genNATSSubject draws a subject: half of the time one that a filter of
// filters would select, or nearly (a wildcard filled with any literal,
// sometimes with none; a literal sometimes changed), otherwise 1 to 5
// random tokens.
func genNATSSubject(r *rand.Rand, filters []string) string {
	var toks []string
	if r.IntN(2) == 0 {
		for _, ft := range strings.Split(pick(r, filters), ".") {
			switch {
			case ft == "*":
				toks = append(toks, natsLiteral(r, true))
			case ft == ">":
				for range r.IntN(4) { // zero tokens too: '>' needs one
					toks = append(toks, natsLiteral(r, true))
				}
			case r.IntN(10) == 0:
				toks = append(toks, natsLiteral(r, true))
			default:
				toks = append(toks, ft)
			}
		}
		if len(toks) == 0 {
			toks = append(toks, pick(r, natsCommon))
		}
	} else {
		for range 1 + r.IntN(5) {
			toks = append(toks, natsLiteral(r, true))
		}
	}
	return strings.Join(toks, ".")
}

// TestNATSConformance checks the nats-tokens/v1 policy against the real
// nats-server: for every generated filter the policy accepts, the server's
// deliveries of every generated subject equal the NATS grammar's Match, and,
// for subjects the policy converts, equal weida's topic.Match of the
// converted pair (and Admit). Filters the policy refuses are listed with
// their rule. The server is a private nats-server process, so that filters
// such as '>' see only this test's subjects.
//
// WEIDA_NATS_SEED picks another seed than the fixed default.
func TestNATSConformance(t *testing.T) {
	testNATSConformance(t, policy.NATSTokensV1(), nil)
}

// TestNATSTailConformance runs the same check under the opt-in
// nats-tokens-tail/v1, which accepts the '>' filters nats-tokens/v1
// refuses: each of them must select on weida, as X.*.#, exactly the
// subjects the server delivers.
func TestNATSTailConformance(t *testing.T) {
	acc := testNATSConformance(t, policy.NATSTail(), nil)
	gt := 0
	for _, f := range acc {
		if f == ">" || strings.HasSuffix(f, ".>") {
			gt++
		}
	}
	t.Logf("%d accepted filters end in '>'", gt)
	if gt < 10 {
		t.Errorf("only %d accepted filters end in '>'; the tail is not exercised", gt)
	}
}

// TestNATSMountedConformance runs the check through a mount of a. at
// shop.orders., over nats-tokens-tail/v1 so that '>' filters inside the
// mount take part too; the extra filters lie inside it.
func TestNATSMountedConformance(t *testing.T) {
	mp, err := policy.NewMounted(policy.NATSTail(), policy.Mount{Foreign: "a.", Weida: "shop.orders."})
	if err != nil {
		t.Fatal(err)
	}
	testNATSConformance(t, mp, []string{"a.*.>", "a.a.>", "a.b.*", "a.*.*", "a.*.c", "a.$x.>", "a.a", "a.b.c"})
}

// testNATSConformance checks p against a private nats-server, with
// extraFilters among the fixed ones, and returns the filters p accepted.
// Under a mount, at least 500 pairs must have a subject inside it.
func testNATSConformance(t *testing.T, p policy.Policy, extraFilters []string) []string {
	srv := brokertest.StartNATS(t)
	seed := uint64(20261129)
	if s := os.Getenv("WEIDA_NATS_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		seed = v
	}
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	g := p.Grammar()

	// Hand-picked edges first, then generated ones.
	filters := []string{
		"*", ">", "*.*", "*.>", "a", "a.*", "a.>", "a.*.c", "*.b", "a.#", "a.b#", "a.*b", "a.**", "a.>.c",
		"$SYS.>", "$SYS.*", "$x.*", "*.$x", "café.*", "日本.>", "a..b", "a.", ".a", "", "a b", "a.\f",
		"a.\xff", "a.*." + strings.Repeat("m", 250), "_INBOX.>",
	}
	filters = append(filters, extraFilters...)
	subjects := []string{
		"a", "a.b", "a.b.c", "a.b.c.d", "b", "b.b", "a.#", "a.b#", "a.*b", "a.*", "a.>", "a.**", "$SYS.x", "$SYS",
		"$x.y", "b.$x", "café.a", "日本.a.b", "a..b", "a.", ".a", "", "a b", "a\tb", "a.\f", "a.\xff",
		"a.b." + strings.Repeat("m", 250), "a." + strings.Repeat("l", 120) + ".c", "_INBOX.x", "\u00a0.a",
	}
	seen := map[string]bool{}
	for _, f := range filters {
		seen[f] = true
	}
	for len(filters) < 150 {
		if f := genNATSFilter(r); !seen[f] {
			seen[f] = true
			filters = append(filters, f)
		}
	}
	seen = map[string]bool{}
	for _, s := range subjects {
		seen[s] = true
	}
	// Subjects are mostly drawn near filters the policy accepts: that is
	// where a mismatch would matter.
	var convertible []string
	for _, f := range filters {
		if _, err := p.ConvertFilter(f); err == nil {
			convertible = append(convertible, f)
		}
	}
	for len(subjects) < 200 {
		from := convertible
		if r.IntN(4) == 0 {
			from = filters
		}
		if s := genNATSSubject(r, from); !seen[s] {
			seen[s] = true
			subjects = append(subjects, s)
		}
	}

	nc := natsConn(t, srv.Addr(), natsgo.Name("conformance"))
	// One shared channel for every subscription: nats.go's read loop
	// fills it, so everything the server sent before a PONG is in it when
	// the flush returns.
	deliveries := make(chan *natsgo.Msg, 1<<20)

	type accepted struct {
		filter, weida string
		sub           *natsgo.Subscription
	}
	var acc []accepted
	refused := map[string][]string{} // rule -> filters
	for _, f := range filters {
		wf, err := p.ConvertFilter(f)
		if err != nil {
			rule := "?"
			var ref *policy.Refusal
			if errors.As(err, &ref) {
				rule = ref.Rule
			}
			refused[rule] = append(refused[rule], f)
			continue
		}
		sub, err := nc.ChanSubscribe(f, deliveries)
		if err != nil {
			t.Errorf("policy accepts filter %q but nats.go refuses to subscribe it: %v", f, err)
			continue
		}
		acc = append(acc, accepted{filter: f, weida: wf, sub: sub})
	}
	if err := nc.FlushTimeout(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := nc.LastError(); err != nil {
		t.Fatalf("the server refused a subscription the policy accepts: %v", err)
	}

	// Publish every subject nats.go lets us publish; the payload names it.
	var published []int
	clientRefused := map[string][]string{}
	for i, s := range subjects {
		if err := nc.Publish(s, []byte(strconv.Itoa(i))); err != nil {
			clientRefused[err.Error()] = append(clientRefused[err.Error()], s)
			continue
		}
		published = append(published, i)
	}
	if err := nc.FlushTimeout(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	bySub := map[*natsgo.Subscription]int{}
	for i, a := range acc {
		bySub[a.sub] = i
	}
	got := map[[2]int]int{} // (accepted filter, subject) -> deliveries
	for len(deliveries) > 0 {
		m := <-deliveries
		si, err := strconv.Atoi(string(m.Data))
		if err != nil || si < 0 || si >= len(subjects) || subjects[si] != m.Subject {
			t.Errorf("unexpected delivery %q on %q", m.Data, m.Subject)
			continue
		}
		got[[2]int{bySub[m.Sub], si}]++
	}

	pairs, converted, delivered, mismatches := 0, 0, 0, 0
	unconvertible := map[string]int{}
	for fi, a := range acc {
		for _, si := range published {
			s := subjects[si]
			pairs++
			n := got[[2]int{fi, si}]
			if n > 1 {
				t.Errorf("filter %q got subject %q %d times", a.filter, s, n)
			}
			server := n > 0
			if server {
				delivered++
			}
			if grammar := g.Match(a.filter, s); grammar != server {
				mismatches++
				t.Errorf("filter %q subject %q: server delivered=%v, grammar Match=%v", a.filter, s, server, grammar)
			}
			wt, err := p.TopicToWeida(s)
			if err != nil {
				var ref *policy.Refusal
				if errors.As(err, &ref) {
					unconvertible[ref.Rule]++
				}
				continue
			}
			converted++
			if w := topic.Match(a.weida, wt) && p.Admit(a.filter, s); w != server {
				mismatches++
				t.Errorf("filter %q (weida %q) subject %q (weida %q): server delivered=%v, weida Match=%v", a.filter, a.weida, s, wt, server, w)
			}
		}
	}
	// Sanity: the generator must reach the server's interesting cases.
	if pairs < 500 {
		t.Errorf("only %d accepted pairs; want at least 500", pairs)
	}
	if delivered == 0 {
		t.Errorf("no pair matched: the generator misses the grammar")
	}

	rules := make([]string, 0, len(refused))
	for rule := range refused {
		rules = append(rules, rule)
	}
	sort.Strings(rules)
	for _, rule := range rules {
		t.Logf("policy refuses %d filters [%s]: %q", len(refused[rule]), rule, refused[rule])
	}
	for reason, subs := range clientRefused {
		t.Logf("nats.go refuses to publish %d subjects (%s): %q", len(subs), reason, subs)
	}
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range unconvertible {
			if !yield(k) {
				return
			}
		}
	})
	for _, k := range keys {
		t.Logf("pairs whose subject has no weida form (the bridge drops and counts it) [%s]: %d", k, unconvertible[k])
	}
	name := p.Name()
	if mp, ok := p.(*policy.Mounted); ok {
		name = fmt.Sprintf("%s mounting %q at %q", name, mp.Mount().Foreign, mp.Mount().Weida)
		if converted < 500 {
			t.Errorf("%s: only %d pairs checked against weida; want at least 500", name, converted)
		}
	}
	t.Logf("%s, seed %d: %d filters (%d accepted), %d subjects (%d published): %d pairs checked against the server, %d of them also against weida; %d delivered, %d mismatches",
		name, seed, len(filters), len(acc), len(subjects), len(published), pairs, converted, delivered, mismatches)
	out := make([]string, len(acc))
	for i, a := range acc {
		out[i] = a.filter
	}
	return out
}
