package brokertest

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// UDPRelay forwards datagrams between one client and a target address on
// loopback until it is cut; then it drops them all, both ways, as a peer
// that was killed or cut off sends nothing more, not even a QUIC
// CONNECTION_CLOSE. It stands between a weida subscriber and a listener
// where a test needs the subscriber to vanish without a word.
type UDPRelay struct {
	front, back *net.UDPConn
	client      atomic.Pointer[net.UDPAddr]
	cut         atomic.Bool
	mute, deaf  atomic.Bool  // see Mute and Deafen
	delay       atomic.Int64 // nanoseconds each datagram is held, each way
	wg          sync.WaitGroup
}

// SetDelay holds every later datagram for d in each direction, as a long
// path does (a round trip then takes at least 2d). Datagrams may come out
// of order, as on a real path; QUIC copes.
func (r *UDPRelay) SetDelay(d time.Duration) { r.delay.Store(int64(d)) }

// send writes b through write now, or after the relay's delay on a copy.
func (r *UDPRelay) send(b []byte, write func([]byte)) {
	d := time.Duration(r.delay.Load())
	if d <= 0 {
		write(b)
		return
	}
	c := append([]byte(nil), b...)
	time.AfterFunc(d, func() {
		if !r.cut.Load() {
			write(c)
		}
	})
}

// NewUDPRelay starts a relay to target ("host:port") on a free loopback
// port; t.Cleanup closes it.
func NewUDPRelay(t testing.TB, target string) *UDPRelay {
	t.Helper()
	ta, err := net.ResolveUDPAddr("udp", target)
	if err != nil {
		t.Fatalf("brokertest: relay target %q: %v", target, err)
	}
	front, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatalf("brokertest: relay: %v", err)
	}
	back, err := net.DialUDP("udp", nil, ta)
	if err != nil {
		_ = front.Close()
		t.Fatalf("brokertest: relay to %s: %v", target, err)
	}
	r := &UDPRelay{front: front, back: back}
	r.wg.Go(r.forward)
	r.wg.Go(r.backward)
	t.Cleanup(r.Close)
	return r
}

// Close stops the relay and waits for its goroutines; closing twice is
// harmless.
func (r *UDPRelay) Close() {
	_ = r.front.Close()
	_ = r.back.Close()
	r.wg.Wait()
}

// Addr is the address clients send to instead of the target.
func (r *UDPRelay) Addr() string { return r.front.LocalAddr().String() }

// Cut drops every later datagram, both ways.
func (r *UDPRelay) Cut() { r.cut.Store(true) }

// Mute drops, while on, what the client sends to the target; Deafen what
// the target sends back. Unlike Cut they can be undone: one direction of
// a path failing for a while, such as a subscriber whose QUIC
// acknowledgements stop reaching the listener.
func (r *UDPRelay) Mute(on bool)   { r.mute.Store(on) }
func (r *UDPRelay) Deafen(on bool) { r.deaf.Store(on) }

func (r *UDPRelay) forward() {
	buf := make([]byte, 65536)
	for {
		n, from, err := r.front.ReadFromUDP(buf)
		if err != nil {
			return
		}
		r.client.Store(from)
		if !r.cut.Load() && !r.mute.Load() {
			r.send(buf[:n], func(b []byte) { _, _ = r.back.Write(b) })
		}
	}
}

func (r *UDPRelay) backward() {
	buf := make([]byte, 65536)
	for {
		n, err := r.back.Read(buf)
		if err != nil {
			return
		}
		if to := r.client.Load(); to != nil && !r.cut.Load() && !r.deaf.Load() {
			r.send(buf[:n], func(b []byte) { _, _ = r.front.WriteToUDP(b, to) })
		}
	}
}
