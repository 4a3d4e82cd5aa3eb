package bench

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

	"weida.dev/connector/weida"
)

// rawALPN keeps the raw rig apart from weida: it speaks no weida at all.
const rawALPN = "weida-bench-raw"

// Raw is quic-go doing the stream work of a [Weida] rig with as many
// subscribers, and nothing else: one connection per receiver over
// loopback, each dialled from a socket of its own (as each weida
// subscriber is) and configured with weida's default windows and stream
// limits. Each message is one uni stream per connection carrying [Frame]
// and a FIN, opened and written in turn by one goroutine, and accepted and
// read to its FIN by the receiver. Nothing parses the bytes.
//
// With one receiver it is the transport's own limit, the bar for the weida
// hop. With many it shows what quic-go pays per copy when every copy goes
// to a different connection and is handed over at once; it is not a lower
// bound there: a sender that lets copies gather per connection, as weida's
// writers do under load, shares packets among them and can spend less.
//
// Create it with [NewRaw]; it is a [Rig]. Run must not be called
// concurrently with itself.
type Raw struct {
	opts    Options
	label   string       // RigLabel's value
	packets *rigCounters // with opts.CountPackets
	frame   []byte
	// Each side owns its sockets and Transports, so that Close can wait
	// for quic-go's goroutines: a Listener from quic.ListenAddr stops its
	// socket's reader only once the last connection is gone, some time
	// after Close returns.
	srvTr  *quic.Transport
	cliTrs []*quic.Transport
	ln     *quic.Listener
	srv    []*quic.Conn // open the streams, like a weida publisher; srv[i] talks to cli[i]
	cli    []*quic.Conn // accept them, like weida subscribers
}

// NewRaw listens and dials receivers connections over 127.0.0.1; ctx
// bounds only the setup.
func NewRaw(ctx context.Context, receivers int, opts Options) (*Raw, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if receivers < 1 {
		return nil, fmt.Errorf("bench: %d raw receivers; need at least one", receivers)
	}
	cert, err := selfSigned()
	if err != nil {
		return nil, err
	}
	srvTLS := &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{rawALPN}, MinVersion: tls.VersionTLS13}
	r := &Raw{opts: opts, label: newRigLabel(), packets: newRigCounters(opts), frame: Frame(opts.Size)}
	if r.srvTr, err = loopbackTransport(); err != nil {
		return nil, err
	}
	pprof.Do(ctx, setupLabels(r.label, SideEndpoint), func(context.Context) {
		r.ln, err = r.srvTr.Listen(srvTLS, rawQUICConfig(false, r.packets.quicTracer()))
	})
	if err != nil {
		_ = r.Close()
		return nil, fmt.Errorf("bench: raw listen: %w", err)
	}
	// Only the raw rig's own listener is dialled: nothing to verify.
	cliTLS := &tls.Config{InsecureSkipVerify: true, NextProtos: []string{rawALPN}, MinVersion: tls.VersionTLS13} //nolint:gosec
	for range receivers {
		tr, err := loopbackTransport()
		if err != nil {
			_ = r.Close()
			return nil, err
		}
		r.cliTrs = append(r.cliTrs, tr)
		var cli *quic.Conn
		pprof.Do(ctx, setupLabels(r.label, SideReceiver), func(ctx context.Context) {
			cli, err = tr.Dial(ctx, r.ln.Addr(), cliTLS, rawQUICConfig(true, r.packets.quicTracer()))
		})
		if err != nil {
			_ = r.Close()
			return nil, fmt.Errorf("bench: raw dial: %w", err)
		}
		r.cli = append(r.cli, cli)
		// One dial at a time, so the connection accepted next is this
		// one's other end; the address check makes sure of it, since
		// credits are counted per receiver.
		srv, err := r.ln.Accept(ctx)
		if err != nil {
			_ = r.Close()
			return nil, fmt.Errorf("bench: raw accept: %w", err)
		}
		r.srv = append(r.srv, srv)
		if srv.RemoteAddr().String() != cli.LocalAddr().String() {
			_ = r.Close()
			return nil, fmt.Errorf("bench: raw accept paired %s with the dial from %s", srv.RemoteAddr(), cli.LocalAddr())
		}
	}
	return r, nil
}

// loopbackTransport is a quic-go Transport on a socket of its own on
// 127.0.0.1.
func loopbackTransport() (*quic.Transport, error) {
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return nil, fmt.Errorf("bench: raw socket: %w", err)
	}
	return &quic.Transport{Conn: udp}, nil
}

// rawQUICConfig mirrors the QUIC configuration package weida uses with its
// default limits, so that the two rigs differ only by weida itself;
// tracer is the rig's packet counting, or nil.
func rawQUICConfig(dialling bool, tracer weida.QUICTracer) *quic.Config {
	c := &quic.Config{
		Tracer:                         tracer,
		MaxIdleTimeout:                 weida.DefaultIdleTimeout,
		MaxIncomingUniStreams:          weida.DefaultMaxConcurrentUniStreams,
		MaxIncomingStreams:             weida.DefaultMaxConcurrentBidiStreams,
		InitialStreamReceiveWindow:     min(weida.DefaultStreamReceiveWindow, 512<<10),
		MaxStreamReceiveWindow:         weida.DefaultStreamReceiveWindow,
		InitialConnectionReceiveWindow: min(weida.DefaultConnectionReceiveWindow, 1<<20),
		MaxConnectionReceiveWindow:     weida.DefaultConnectionReceiveWindow,
	}
	if dialling {
		c.KeepAlivePeriod = weida.DefaultKeepAlive
	}
	return c
}

// Name implements [Rig].
func (r *Raw) Name() string {
	if len(r.cli) == 1 {
		return "raw quic-go"
	}
	return fmt.Sprintf("raw quic-go, %d connections", len(r.cli))
}

// Receivers implements [Rig]: the number of connections.
func (r *Raw) Receivers() int { return len(r.cli) }

// Label implements [Rig].
func (r *Raw) Label() string { return r.label }

// Run implements [Rig].
func (r *Raw) Run(ctx context.Context, load Load) (Sample, error) {
	if err := load.check(); err != nil {
		return Sample{}, err
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	c := newCredits(len(r.cli), r.opts.Window)
	var copies atomic.Int64
	for i, cli := range r.cli {
		wg.Go(func() {
			labelSide(rctx, r.label, SideReceiver)
			buf := make([]byte, 4096)
			for {
				st, err := cli.AcceptUniStream(rctx)
				if err != nil {
					if rctx.Err() == nil {
						c.fail(fmt.Errorf("bench: raw accept stream: %w", err))
					}
					return
				}
				for {
					_, err = st.Read(buf)
					if err != nil {
						break
					}
				}
				if !errors.Is(err, io.EOF) {
					c.fail(fmt.Errorf("bench: raw read: %w", err))
					return
				}
				copies.Add(1)
				c.give(i)
			}
		})
	}
	defer labelSide(ctx, r.label, SideEndpoint)()
	m := startMeter(r.packets)
	n, err := sendLoop(ctx, load, c, func() error {
		for _, srv := range r.srv {
			st, err := srv.OpenUniStreamSync(ctx)
			if err != nil {
				return fmt.Errorf("bench: raw open stream: %w", err)
			}
			if _, err := st.Write(r.frame); err != nil {
				return fmt.Errorf("bench: raw write: %w", err)
			}
			if err := st.Close(); err != nil {
				return err
			}
		}
		return nil
	})
	return m.stop(n, copies.Load()), err
}

// Close closes the connections, the listener and the transports, and
// returns once quic-go's goroutines for them have ended.
func (r *Raw) Close() error {
	for _, c := range append(r.cli, r.srv...) {
		_ = c.CloseWithError(0, "")
	}
	if r.ln != nil {
		_ = r.ln.Close()
	}
	var errs []error
	for _, tr := range append(r.cliTrs, r.srvTr) {
		if tr != nil {
			errs = append(errs, tr.Close(), tr.Conn.Close())
		}
	}
	return errors.Join(errs...)
}

// selfSigned makes the raw listener's certificate.
func selfSigned() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("bench: key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "weida bench raw quic-go"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("bench: certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
