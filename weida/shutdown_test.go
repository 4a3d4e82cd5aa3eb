package weida

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/weida/wire"
)

// steadyPublisher publishes on p until stopped and counts the copies each
// Publish reported queued.
type steadyPublisher struct {
	queued atomic.Int64
	stop   chan struct{}
	wg     sync.WaitGroup
}

func publishSteadily(t *testing.T, p *Publisher) *steadyPublisher {
	sp := &steadyPublisher{stop: make(chan struct{})}
	payload := make([]byte, 256)
	sp.wg.Go(func() {
		for {
			select {
			case <-sp.stop:
				return
			default:
			}
			res, err := p.Publish(context.Background(), Message{Topic: "steady", Payload: payload})
			if err != nil {
				t.Errorf("Publish: %v", err)
				return
			}
			sp.queued.Add(int64(res.Queued))
			time.Sleep(50 * time.Microsecond)
		}
	})
	return sp
}

func (sp *steadyPublisher) halt() int64 {
	close(sp.stop)
	sp.wg.Wait()
	return sp.queued.Load()
}

// receiveAll calls Receive until it fails, counting the copies, and
// returns the count and the error through the channel.
func receiveAll(s *Subscriber, got *atomic.Int64) <-chan error {
	end := make(chan error, 1)
	go func() {
		for {
			if _, err := s.Receive(context.Background()); err != nil {
				end <- err
				return
			}
			got.Add(1)
		}
	}()
	return end
}

// TestShutdownLosesNothing: a subscriber that leaves with Shutdown while
// its publisher publishes steadily accounts for every copy the publisher
// queued for it: received, or counted unread. Run it with -count=20.
func TestShutdownLosesNothing(t *testing.T) {
	l := listen(t, ListenConfig{})
	p := publisher(t, l, "/steady")
	s := dial(t, l, "/steady", DialConfig{})
	subscribe(t, l, s, 1, "#")
	var got atomic.Int64
	end := receiveAll(s, &got)
	sp := publishSteadily(t, p)
	waitFor(t, "copies to flow", func() bool { return got.Load() >= 200 })

	if err := s.Shutdown(testCtx(t)); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	queued := sp.halt()
	if err := <-end; !errors.Is(err, ErrClosed) {
		t.Fatalf("Receive after Shutdown: %v, want ErrClosed", err)
	}
	st, ls := s.Stats(), l.Stats()
	t.Logf("Shutdown: queued %d, received %d, unread %d; listener: written %d, dropped %+v",
		queued, got.Load(), st.DroppedUnread, ls.CopiesWritten, ls.Dropped)
	if accounted := got.Load() + int64(st.DroppedUnread); accounted != queued {
		t.Errorf("the publisher queued %d copies for the subscriber; %d were received and %d counted unread: %d unaccounted",
			queued, got.Load(), st.DroppedUnread, queued-accounted)
	}
	if err := s.Subscribe(testCtx(t), "a"); !errors.Is(err, ErrClosed) {
		t.Errorf("Subscribe after Shutdown: %v, want ErrClosed", err)
	}
}

// TestCloseLosesCopiesInFlight is TestShutdownLosesNothing with Close: the
// copies between the two QUIC stacks when the connection closes are
// counted nowhere. How many depends on timing, so it is logged, not
// asserted.
func TestCloseLosesCopiesInFlight(t *testing.T) {
	l := listen(t, ListenConfig{})
	p := publisher(t, l, "/steady")
	s := dial(t, l, "/steady", DialConfig{})
	subscribe(t, l, s, 1, "#")
	var got atomic.Int64
	end := receiveAll(s, &got)
	sp := publishSteadily(t, p)
	waitFor(t, "copies to flow", func() bool { return got.Load() >= 200 })

	_ = s.Close()
	<-end
	// The listener learns of the close and counts what was still queued.
	waitFor(t, "the listener to drop the connection", func() bool { return l.Stats().Connections == 0 })
	queued := sp.halt()
	st, ls := s.Stats(), l.Stats()
	lost := queued - got.Load() - int64(st.DroppedUnread) - int64(ls.Dropped.ConnectionClosed)
	t.Logf("Close: queued %d, received %d, unread %d, dropped by the listener as connection-closed %d: %d lost uncounted",
		queued, got.Load(), st.DroppedUnread, ls.Dropped.ConnectionClosed, lost)
}

// TestShutdownWithoutReader: nobody calls Receive, so Shutdown waits for
// its ctx, returns its error, and counts the copies that waited as unread.
func TestShutdownWithoutReader(t *testing.T) {
	l := listen(t, ListenConfig{})
	p := publisher(t, l, "/idle")
	s := dial(t, l, "/idle", DialConfig{})
	subscribe(t, l, s, 1, "#")
	for range 10 {
		publish(t, p, "t", []byte("x"))
	}
	waitFor(t, "10 copies to arrive", func() bool { return s.queue.pending() == 10 })
	ctx, cancel := context.WithTimeout(testCtx(t), 200*time.Millisecond)
	defer cancel()
	if err := s.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown = %v, want DeadlineExceeded", err)
	}
	if st := s.Stats(); st.DroppedUnread != 10 || st.Received != 0 {
		t.Fatalf("stats after Shutdown: %+v, want 10 unread", st)
	}
	if _, err := s.Receive(testCtx(t)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Receive: %v, want ErrClosed", err)
	}
	waitFor(t, "the listener to forget the subscription", func() bool { return l.Stats().Subscriptions == 0 })
}

// TestShutdownAfterLoss: Shutdown of a subscriber whose connection is
// already gone closes and returns at once, and a second call is harmless.
func TestShutdownAfterLoss(t *testing.T) {
	l := listen(t, ListenConfig{})
	publisher(t, l, "/gone")
	s := dial(t, l, "/gone", DialConfig{})
	subscribe(t, l, s, 1, "#")
	_ = l.Close()
	<-s.Done()
	if err := s.Shutdown(testCtx(t)); err != nil {
		t.Fatalf("Shutdown after loss: %v", err)
	}
	if err := s.Shutdown(testCtx(t)); err != nil {
		t.Fatalf("second Shutdown: %v", err)
	}
}

// TestShutdownOnLongPath: on a path whose four round trips exceed the gap
// between a Listener's keep-alive PINGs, packets never fall quiet; the
// quiet period is about copies, so Shutdown still ends, and loses nothing.
func TestShutdownOnLongPath(t *testing.T) {
	l := listen(t, ListenConfig{})
	p := publisher(t, l, "/far")
	relay := brokertest.NewUDPRelay(t, l.Addr().String())
	relay.SetDelay(120 * time.Millisecond) // a round trip of 240 ms or more
	s, err := Dial(testCtx(t), fmt.Sprintf("weida://%s@%s/far", l.Fingerprint(), relay.Addr()), DialConfig{ProbeAfter: -1})
	if err != nil {
		t.Fatalf("Dial through the relay: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	subscribe(t, l, s, 1, "#")
	var got atomic.Int64
	end := receiveAll(s, &got)
	sp := publishSteadily(t, p)
	waitFor(t, "copies to flow", func() bool { return got.Load() >= 50 })

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown on a long path: %v (it should end once copies stop, whatever the keep-alives do)", err)
	}
	queued := sp.halt()
	<-end
	if accounted := got.Load() + int64(s.Stats().DroppedUnread); accounted != queued {
		t.Errorf("the publisher queued %d copies; %d received, %d unread", queued, got.Load(), s.Stats().DroppedUnread)
	}
}

// TestShutdownAfterLateResubscribe: a liveness probe sent just before
// Shutdown is a SUBSCRIBE of a held filter; if QUIC resent it after the
// UNSUBSCRIBE arrived, the publisher would hold the filter again and, under
// steady publishing, copies would never stop. Shutdown resends its
// UNSUBSCRIBEs while copies keep coming, so it still ends, losing nothing.
func TestShutdownAfterLateResubscribe(t *testing.T) {
	l := listen(t, ListenConfig{})
	p := publisher(t, l, "/late")
	s := dial(t, l, "/late", DialConfig{ProbeAfter: -1})
	subscribe(t, l, s, 1, "#")
	var got atomic.Int64
	end := receiveAll(s, &got)
	sp := publishSteadily(t, p)
	waitFor(t, "copies to flow", func() bool { return got.Load() >= 100 })

	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		done <- s.Shutdown(ctx)
	}()
	waitFor(t, "the UNSUBSCRIBE to be applied", func() bool { return l.Stats().Subscriptions == 0 })
	// The late probe: the same SUBSCRIBE arriving after the UNSUBSCRIBE.
	if err := s.sendSubscription(testCtx(t), wire.KindSubscribe, "#", probePadding, nil); err != nil {
		t.Fatalf("the late SUBSCRIBE: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Shutdown after a late re-SUBSCRIBE: %v (the publisher kept the filter)", err)
	}
	queued := sp.halt()
	<-end
	if accounted := got.Load() + int64(s.Stats().DroppedUnread); accounted != queued {
		t.Errorf("the publisher queued %d copies; %d received, %d unread", queued, got.Load(), s.Stats().DroppedUnread)
	}
}
