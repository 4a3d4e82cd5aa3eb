package amqp

import (
	"net"
	"sync"
)

// maxPendingWrite bounds the bytes a coalescingConn holds unwritten; a
// writer beyond it waits for the flusher, as it would wait for the kernel.
const maxPendingWrite = 1 << 20

// coalescingConn gathers the writes of the AMQP client into as few system
// calls as the network allows. amqp091 flushes its buffer after every frame
// set (each publish, each ack), one write(2) each; here a Write only copies
// into a buffer, and one flusher goroutine writes out whatever has gathered
// while its previous write was under way. Under load many publishes share a
// system call; an idle connection writes each frame at once, with no delay.
//
// A write error is returned by every later Write, and closes the
// connection, so that amqp091's reader fails and shuts the connection down.
// Close waits for the flusher.
type coalescingConn struct {
	net.Conn

	mu      sync.Mutex
	cond    *sync.Cond // signalled when buf is taken or the conn fails
	buf     []byte     // gathered, not yet handed to the flusher
	err     error      // first write error, or net.ErrClosed after Close
	closed  bool
	writing bool // the flusher is in a write

	wake chan struct{} // buffered 1: there is something to write
	done chan struct{} // closed when the flusher has ended
}

func newCoalescingConn(c net.Conn) *coalescingConn {
	cc := &coalescingConn{Conn: c, wake: make(chan struct{}, 1), done: make(chan struct{})}
	cc.cond = sync.NewCond(&cc.mu)
	go cc.flusher()
	return cc
}

func (c *coalescingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.err == nil && len(c.buf) > 0 && len(c.buf)+len(p) > maxPendingWrite {
		c.cond.Wait()
	}
	if c.err != nil {
		return 0, c.err
	}
	c.buf = append(c.buf, p...)
	select {
	case c.wake <- struct{}{}:
	default:
	}
	return len(p), nil
}

func (c *coalescingConn) flusher() {
	defer close(c.done)
	var out []byte
	for range c.wake {
		c.mu.Lock()
		if c.closed && len(c.buf) == 0 {
			c.mu.Unlock()
			return
		}
		out, c.buf = c.buf, out[:0]
		c.writing = len(out) > 0
		c.cond.Broadcast()
		c.mu.Unlock()
		if len(out) == 0 {
			continue
		}
		_, err := c.Conn.Write(out)
		c.mu.Lock()
		c.writing = false
		if err != nil && c.err == nil {
			c.err = err
		}
		c.cond.Broadcast()
		c.mu.Unlock()
		if err != nil {
			c.Conn.Close()
		}
	}
}

// Close closes the connection at once (what is gathered and unwritten is
// dropped, as the kernel would drop it) and waits for the flusher.
func (c *coalescingConn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		<-c.done
		return nil
	}
	c.closed = true
	if c.err == nil {
		c.err = net.ErrClosed
	}
	c.buf = c.buf[:0]
	c.cond.Broadcast()
	c.mu.Unlock()
	err := c.Conn.Close()
	select {
	case c.wake <- struct{}{}:
	default:
	}
	<-c.done
	return err
}
