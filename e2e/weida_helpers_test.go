package e2e

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	mrand "math/rand/v2"
	"sync"
	"testing"
	"time"

	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/weida"
)

// unique returns a short random token: topics and client ids of one test
// never meet those of another test or run on a shared broker.
func unique() string { return fmt.Sprintf("e2e%08x", mrand.Uint32()) }

// ready reports whether the resource's Ready condition is True.
func (s ResourceStatus) ready() bool {
	for _, c := range s.Conditions {
		if c.Type == "Ready" {
			return c.Status == "True"
		}
	}
	return false
}

// weidaCert writes a self-signed ECDSA P-256 certificate and its key under
// dir and returns the two paths and the certificate's weida fingerprint,
// so that a resource can listen with a known identity that another
// resource (or a test) pins.
func weidaCert(t testing.TB, dir string) (certFile, keyFile, fingerprint string) {
	t.Helper()
	c := brokertest.WriteCert(t, dir, "endpoint", &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "e2e weida endpoint"},
		DNSNames:     []string{"localhost"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}, nil)
	return c.CertFile, c.KeyFile, weida.Fingerprint(c.Cert)
}

// weidaCollector is a weida subscriber on a connector's endpoint that
// receives in the background and keeps every message. When the connection
// is lost (the connector restarted its listener, say) it dials again and
// subscribes the same filters, as any weida subscriber must: weida keeps no
// session.
//
// Its methods are safe for concurrent use; Close (also run at the end of the
// test) stops the receive goroutine and waits for it.
type weidaCollector struct {
	t       testing.TB
	url     string
	cfg     weida.DialConfig
	filters []string

	mu      sync.Mutex
	msgs    []weida.Message
	dials   int
	current *weida.Subscriber

	cancel context.CancelFunc
	done   chan struct{}
}

// collectWeida dials url (trusting any certificate unless the URL pins
// one), subscribes filters and starts receiving. It returns once the first
// connection is subscribed; the publisher may not have read the SUBSCRIBE
// yet (weida has no acknowledgement), so callers synchronise with
// [weidaCollector.Sync] before counting.
func collectWeida(t testing.TB, url string, limits weida.Limits, filters ...string) *weidaCollector {
	t.Helper()
	c := &weidaCollector{
		t:       t,
		url:     url,
		cfg:     weida.DialConfig{InsecureSkipVerifyForTesting: true, Limits: limits},
		filters: filters,
		done:    make(chan struct{}),
	}
	sub, err := c.dial(ctx(t, 20*time.Second))
	if err != nil {
		t.Fatalf("weida subscriber on %s: %v", url, err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go c.run(rctx, sub)
	t.Cleanup(c.Close)
	return c
}

// dialWeidaRetry dials until the endpoint answers or ctx ends: the
// connector may still be starting its listener.
func (c *weidaCollector) dial(ctx context.Context) (*weida.Subscriber, error) {
	for {
		sub, err := c.dialOnce(ctx)
		if err == nil {
			return sub, nil
		}
		select {
		case <-ctx.Done():
			return nil, errors.Join(ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (c *weidaCollector) dialOnce(ctx context.Context) (*weida.Subscriber, error) {
	dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	sub, err := weida.Dial(dctx, c.url, c.cfg)
	if err != nil {
		return nil, err
	}
	for _, f := range c.filters {
		// A filter the endpoint's scopes refuse is refused one way: a
		// refusal seen in time is no failure of the dial.
		if err := sub.Subscribe(dctx, f); err != nil && !errors.Is(err, weida.ErrSubscriptionRefused) {
			sub.Close()
			return nil, err
		}
	}
	c.mu.Lock()
	c.dials++
	c.current = sub
	c.mu.Unlock()
	return sub, nil
}

func (c *weidaCollector) run(ctx context.Context, sub *weida.Subscriber) {
	defer close(c.done)
	for {
		m, err := sub.Receive(ctx)
		if err == nil {
			c.mu.Lock()
			c.msgs = append(c.msgs, m)
			c.mu.Unlock()
			continue
		}
		sub.Close()
		if ctx.Err() != nil {
			return
		}
		if sub, err = c.dial(ctx); err != nil {
			return
		}
	}
}

// Close stops receiving and closes the connection. It may be called more
// than once.
func (c *weidaCollector) Close() {
	c.cancel()
	<-c.done
}

// Messages returns a copy of everything received so far.
func (c *weidaCollector) Messages() []weida.Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]weida.Message(nil), c.msgs...)
}

// Len returns how many messages arrived.
func (c *weidaCollector) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.msgs)
}

// Dials returns how many connections the collector made.
func (c *weidaCollector) Dials() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dials
}

// Reset forgets the messages received so far.
func (c *weidaCollector) Reset() {
	c.mu.Lock()
	c.msgs = nil
	c.mu.Unlock()
}

// Has reports whether a message with this topic and payload arrived.
func (c *weidaCollector) Has(topic, payload string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.msgs {
		if m.Topic == topic && string(m.Payload) == payload {
			return true
		}
	}
	return false
}

// Sync makes sure the collector's subscriptions are in force end to end:
// it calls probe (which sends a message the collector's filters select,
// carrying payload) every 200 ms until that payload arrives, then forgets
// everything received. A weida SUBSCRIBE has no acknowledgement, so this is
// the only way to know that the publisher holds it.
func (c *weidaCollector) Sync(d time.Duration, payload string, probe func()) {
	c.t.Helper()
	deadline := time.Now().Add(d)
	for {
		probe()
		for range 10 {
			if c.hasPayload(payload) {
				c.Reset()
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("weida subscriber on %s never received the probe %q", c.url, payload)
		}
	}
}

func (c *weidaCollector) hasPayload(p string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.msgs {
		if string(m.Payload) == p {
			return true
		}
	}
	return false
}

// weidaPublisher hosts a weida publisher endpoint for outbound resources to
// dial: it returns the publisher and the pinned URL to write in the
// resource's spec.weida.dial.
func weidaPublisher(t testing.TB, path string) (*weida.Publisher, string) {
	t.Helper()
	l, err := weida.Listen(context.Background(), "127.0.0.1:0", weida.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	pub, err := l.Publisher(path)
	if err != nil {
		t.Fatal(err)
	}
	return pub, "weida://" + l.Fingerprint() + "@" + l.Addr().String() + path
}

// waitSubscribers waits until pub has at least n subscriber connections.
func waitSubscribers(t testing.TB, pub *weida.Publisher, n int, d time.Duration) {
	t.Helper()
	Eventually(t, d, "weida subscribers on "+pub.Path(), func() bool { return pub.Subscribers() >= n })
}
