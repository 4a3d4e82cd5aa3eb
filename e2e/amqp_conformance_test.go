package e2e

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"weida.dev/connector/policy"
	"weida.dev/connector/weida/topic"
)

// conformanceKeys returns the binding and routing keys of the conformance
// test: every key of up to four words over small alphabets (so empty words,
// the empty routing key, '#' in every position and '#.#' all occur),
// hand-picked edge cases, and seeded random longer keys.
func conformanceKeys(seed uint64) (bindings, routings []string) {
	var words func(alphabet []string, n int) [][]string
	words = func(alphabet []string, n int) [][]string {
		if n == 0 {
			return [][]string{nil}
		}
		var out [][]string
		for _, w := range words(alphabet, n-1) {
			for _, a := range alphabet {
				out = append(out, append(slices.Clone(w), a))
			}
		}
		return out
	}
	seen := map[string]bool{}
	add := func(dst *[]string, k string) {
		if !seen[k] {
			seen[k] = true
			*dst = append(*dst, k)
		}
	}
	// Binding keys: up to three words over a, "", *, #; four words over
	// a, *, #. That puts '#' in every position of keys of one to four
	// words, next to literals, empty words, '*' and another '#'.
	for n := 1; n <= 3; n++ {
		for _, w := range words([]string{"a", "", "*", "#"}, n) {
			add(&bindings, strings.Join(w, "."))
		}
	}
	for _, w := range words([]string{"a", "*", "#"}, 4) {
		add(&bindings, strings.Join(w, "."))
	}
	for _, k := range []string{"", "#.#", "#.#.#", "b.#", "a.b", "#.b", "a.#.b", "b.*.a", "a.b.#", "*.b.#"} {
		add(&bindings, k)
	}
	// Routing keys: every key of zero to four words over a, b, "" (the
	// zero-word key and the one-empty-word key are both "").
	seen = map[string]bool{}
	for n := 0; n <= 4; n++ {
		for _, w := range words([]string{"a", "b", ""}, n) {
			add(&routings, strings.Join(w, "."))
		}
	}
	// No long keys: RabbitMQ's routing cost grows with the key's words to
	// the power of a binding's '#' words (a 128-word key against bindings
	// like #.#.#.# takes minutes); 255-byte keys are the driver tests'.
	for _, k := range []string{"a.\xff", "café.a", "*", "#", "a.*", "a.#.b"} {
		add(&routings, k)
	}
	r := rand.New(rand.NewPCG(seed, seed))
	pick := func(alphabet []string, max int) string {
		w := make([]string, 1+r.IntN(max))
		for i := range w {
			w[i] = alphabet[r.IntN(len(alphabet))]
		}
		return strings.Join(w, ".")
	}
	seen = map[string]bool{}
	for _, k := range bindings {
		seen[k] = true
	}
	for range 20 {
		add(&bindings, pick([]string{"a", "b", "", "*", "#"}, 7))
	}
	seen = map[string]bool{}
	for _, k := range routings {
		seen[k] = true
	}
	for range 40 {
		add(&routings, pick([]string{"a", "b", ""}, 8))
	}
	return bindings, routings
}

// TestAMQPConformance checks the policy's model of RabbitMQ's topic routing
// against the real broker: one exclusive queue per binding key on a fresh
// topic exchange, every routing key published once (publisher confirms are
// the barrier: a confirmed message has been routed and enqueued), then each
// queue's contents compared with
//
//   - policy.AMQPGrammar().Match(binding, routing) for every pair, and
//   - topic.Match(ConvertFilter(binding), TopicToWeida(routing)) for every
//     binding key amqp-words/v1 accepts and every routing key it converts.
//
// Refused binding keys and unconvertible routing keys are listed with the
// policy's reasons.
func TestAMQPConformance(t *testing.T) {
	requireTCP(t, "RabbitMQ", rabbitAddr)
	seed := uint64(time.Now().UnixNano())
	bindings, routings := conformanceKeys(seed)
	t.Logf("seed %d: %d binding keys × %d routing keys = %d pairs", seed, len(bindings), len(routings), len(bindings)*len(routings))
	if n := len(bindings) * len(routings); n < 500 {
		t.Fatalf("only %d pairs", n)
	}
	c := amqpConnect(t, rabbitAddr)
	exchange := "e2e-conformance-" + unique()
	if err := c.ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.ch.ExchangeDelete(exchange, false, false) })
	queues := make([]string, len(bindings))
	for i, b := range bindings {
		q, err := c.ch.QueueDeclare("", false, true, true, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.ch.QueueBind(q.Name, b, exchange, false, nil); err != nil {
			t.Fatalf("RabbitMQ refused binding key %q: %v", b, err)
		}
		queues[i] = q.Name
	}

	// Publish everything, then wait for every confirm.
	confirms := make([]*amqp.DeferredConfirmation, len(routings))
	for j, k := range routings {
		dc, err := c.ch.PublishWithDeferredConfirm(exchange, k, false, false, amqp.Publishing{Body: []byte(strconv.Itoa(j))})
		if err != nil {
			t.Fatalf("publish %q: %v", k, err)
		}
		confirms[j] = dc
	}
	cctx := ctx(t, 30*time.Second)
	for j, dc := range confirms {
		if ok, err := dc.WaitContext(cctx); err != nil || !ok {
			t.Fatalf("routing key %q not confirmed: ack %v, %v", routings[j], ok, err)
		}
	}

	// What RabbitMQ routed: got[i][j] for binding i, routing key j.
	got := make([][]bool, len(bindings))
	for i, q := range queues {
		got[i] = make([]bool, len(routings))
		for {
			d, ok, err := c.ch.Get(q, true)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
			j, err := strconv.Atoi(string(d.Body))
			if err != nil || j < 0 || j >= len(routings) || got[i][j] {
				t.Fatalf("queue of %q: unexpected or repeated body %q", bindings[i], d.Body)
			}
			got[i][j] = true
		}
	}

	p := policy.AMQPWordsV1()
	g := p.Grammar()
	weidaTopics := make([]string, len(routings))
	convertible := make([]bool, len(routings))
	var unconvertible []string
	for j, k := range routings {
		wt, err := p.TopicToWeida(k)
		if err != nil {
			unconvertible = append(unconvertible, fmt.Sprintf("%q [%s]", k, rule(err)))
			continue
		}
		weidaTopics[j], convertible[j] = wt, true
	}
	var refused []string
	var grammarPairs, weidaPairs, matches int
	for i, b := range bindings {
		wf, ferr := p.ConvertFilter(b)
		if ferr != nil {
			refused = append(refused, fmt.Sprintf("%q [%s]", b, rule(ferr)))
		}
		for j, k := range routings {
			actual := got[i][j]
			if actual {
				matches++
			}
			grammarPairs++
			if want := g.Match(b, k); want != actual {
				t.Errorf("binding %q, routing key %q: RabbitMQ routed %v, AMQPGrammar().Match says %v", b, k, actual, want)
			}
			if ferr != nil || !convertible[j] {
				continue
			}
			weidaPairs++
			if w := topic.Match(wf, weidaTopics[j]) && p.Admit(b, k); w != actual {
				t.Errorf("binding %q → weida %q, routing key %q → %q: RabbitMQ routed %v, weida matches %v", b, wf, k, weidaTopics[j], actual, w)
			}
		}
	}
	// The same deliveries through a mount of a. at audit.eu.: inside it,
	// RabbitMQ's routing must equal weida's matching of the mounted
	// conversions; outside it, the mount refuses binding and routing keys.
	mp, err := policy.NewMounted(p, policy.Mount{Foreign: "a.", Weida: "audit.eu."})
	if err != nil {
		t.Fatal(err)
	}
	mountedPairs := 0
	for i, b := range bindings {
		wf, ferr := mp.ConvertFilter(b)
		if ferr != nil {
			continue
		}
		for j, k := range routings {
			wt, terr := mp.TopicToWeida(k)
			if terr != nil {
				continue
			}
			mountedPairs++
			if w := topic.Match(wf, wt) && mp.Admit(b, k); w != got[i][j] {
				t.Errorf("mounted: binding %q → weida %q, routing key %q → %q: RabbitMQ routed %v, weida matches %v", b, wf, k, wt, got[i][j], w)
			}
		}
	}
	t.Logf("%d pairs checked against the grammar (%d routed by RabbitMQ), %d against weida's matching", grammarPairs, matches, weidaPairs)
	t.Logf("%s mounting \"a.\" at \"audit.eu.\": %d pairs checked against weida's matching", p.Name(), mountedPairs)
	if mountedPairs < 500 {
		t.Errorf("only %d pairs checked through the mount", mountedPairs)
	}
	t.Logf("%d binding keys refused by %s:\n  %s", len(refused), p.Name(), strings.Join(refused, "\n  "))
	t.Logf("%d routing keys not converted:\n  %s", len(unconvertible), strings.Join(unconvertible, "\n  "))
	if weidaPairs < 500 {
		t.Errorf("only %d pairs checked against weida", weidaPairs)
	}
}

func rule(err error) string {
	var r *policy.Refusal
	if errors.As(err, &r) {
		return r.Rule
	}
	return err.Error()
}
