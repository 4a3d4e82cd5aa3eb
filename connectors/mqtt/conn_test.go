package mqtt

import (
	"bufio"
	"fmt"
	"net"
	"sync"
	"testing"

	"github.com/eclipse/paho.golang/packets"
)

// TestBufferedConnWritesWholePackets writes packets from many goroutines at
// once, as paho does (Sink writes, PUBACKs, PINGREQ), and checks that the
// other end reads every one of them intact: the wrapper must keep each
// packet's slices together, which net.Buffers does not do on a wrapped
// connection by itself.
func TestBufferedConnWritesWholePackets(t *testing.T) {
	client, server := net.Pipe()
	defer server.Close()
	conn := &bufferedConn{Conn: client, r: bufio.NewReader(client)}
	defer conn.Close()

	const writers, each = 16, 50
	got := make(chan error, 1)
	go func() {
		// On a failure the pipe is closed, so that the writers stop too.
		defer server.Close()
		seen := make(map[string]bool)
		for len(seen) < writers*each {
			cp, err := packets.ReadPacket(server)
			if err != nil {
				got <- fmt.Errorf("after %d packets: %w", len(seen), err)
				return
			}
			p, ok := cp.Content.(*packets.Publish)
			if !ok {
				got <- fmt.Errorf("packet type %d, want PUBLISH", cp.Type)
				return
			}
			if want := "t/" + string(p.Payload); p.Topic != want {
				got <- fmt.Errorf("topic %q with payload %q: packets interleaved", p.Topic, p.Payload)
				return
			}
			seen[p.Topic] = true
		}
		got <- nil
	}()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				id := fmt.Sprintf("%d-%d", w, i)
				p := &packets.Publish{Topic: "t/" + id, QoS: 1, PacketID: uint16(w*each + i + 1), Payload: []byte(id),
					Properties: &packets.Properties{ContentType: "text/plain"}}
				if _, err := p.WriteTo(conn); err != nil {
					return // the reader stopped; it says why
				}
			}
		})
	}
	wg.Wait()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}
