package brokertest

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
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
	wg          sync.WaitGroup
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

func (r *UDPRelay) forward() {
	buf := make([]byte, 65536)
	for {
		n, from, err := r.front.ReadFromUDP(buf)
		if err != nil {
			return
		}
		r.client.Store(from)
		if !r.cut.Load() {
			_, _ = r.back.Write(buf[:n])
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
		if to := r.client.Load(); to != nil && !r.cut.Load() {
			_, _ = r.front.WriteToUDP(buf[:n], to)
		}
	}
}
