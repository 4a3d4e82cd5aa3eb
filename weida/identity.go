package weida

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"sync"
	"sync/atomic"
	"time"

	"weida.dev/connector/internal/filestamp"
	"weida.dev/connector/internal/safefile"
	"weida.dev/connector/weida/address"
)

// ALPN is the only TLS application protocol a weida v0 peer offers or
// accepts (PROTOCOL §2.1).
const ALPN = "weida/0"

// Fingerprint returns a certificate's weida identity: "sha256:" and the
// lowercase hex SHA-256 of its DER SubjectPublicKeyInfo (ARCHITECTURE §2).
// It depends only on the key, so a renewed certificate with the same key
// keeps its fingerprint.
func Fingerprint(cert *x509.Certificate) string {
	return fingerprintSPKI(cert.RawSubjectPublicKeyInfo)
}

func fingerprintSPKI(spki []byte) string {
	sum := sha256.Sum256(spki)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// fingerprintDER parses one DER certificate and returns its fingerprint.
func fingerprintDER(der []byte) (string, error) {
	c, err := x509.ParseCertificate(der)
	if err != nil {
		return "", fmt.Errorf("weida: parsing peer certificate: %w", err)
	}
	return Fingerprint(c), nil
}

// loadKeyPair loads a PEM certificate chain and key; both names must be set
// or both empty (ok=false then).
func loadKeyPair(certFile, keyFile, what string) (cert tls.Certificate, ok bool, err error) {
	switch {
	case certFile == "" && keyFile == "":
		return tls.Certificate{}, false, nil
	case certFile == "" || keyFile == "":
		return tls.Certificate{}, false, fmt.Errorf("weida: %s: CertFile and KeyFile must be set together", what)
	}
	certPEM, err := safefile.ReadFile(certFile, MaxPEMFileBytes)
	if err == nil {
		var keyPEM []byte
		if keyPEM, err = safefile.ReadFile(keyFile, MaxPEMFileBytes); err == nil {
			cert, err = tls.X509KeyPair(certPEM, keyPEM)
		}
	}
	if err != nil {
		return tls.Certificate{}, false, fmt.Errorf("weida: %s: loading %s and %s: %w", what, certFile, keyFile, err)
	}
	return cert, true, nil
}

// MaxPEMFileBytes bounds every certificate, key and CA file this package
// reads; a bigger one is refused. Only regular files are read: a named
// pipe or a device is refused before it is opened, since reading one may
// block forever or never end.
const MaxPEMFileBytes = 1 << 20

// leafFingerprint returns the fingerprint of a loaded certificate's leaf.
func leafFingerprint(c *tls.Certificate) (string, error) {
	if c.Leaf != nil {
		return Fingerprint(c.Leaf), nil
	}
	if len(c.Certificate) == 0 {
		return "", errors.New("weida: certificate chain is empty")
	}
	return fingerprintDER(c.Certificate[0])
}

// selfSigned generates an ECDSA P-256 key and a self-signed certificate for
// it.
func selfSigned() (tls.Certificate, error) {
	key, err := newKey()
	if err != nil {
		return tls.Certificate{}, err
	}
	der, err := selfSignedDER(key)
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("weida: parsing self-signed certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

func newKey() (*ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("weida: generating key: %w", err)
	}
	return key, nil
}

// selfSignedDER returns a self-signed certificate for key, valid from an
// hour ago for ten years. Subscribers trust it by pinning its fingerprint,
// so its names and dates do not matter; it carries "localhost" for tools
// that insist on a name.
func selfSignedDER(key crypto.Signer) ([]byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("weida: generating serial: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "weida self-signed"},
		DNSNames:              []string{"localhost"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("weida: creating self-signed certificate: %w", err)
	}
	return der, nil
}

// CertCheckInterval is how often, at most, a listener with CertFile and
// KeyFile looks at the two files again (at a TLS handshake, or when asked
// its fingerprint): when either changed, it loads the pair and serves it
// to the connections that follow.
const CertCheckInterval = time.Second

// certReloader serves a listener's certificate from its CertFile and
// KeyFile, loading them again when their stamps change (see
// [CertCheckInterval]). A pair that fails to load (a certificate written
// before its key, a damaged file) is logged and the previous certificate
// served until the files change again. Safe for concurrent use.
type certReloader struct {
	certFile, keyFile string
	log               *slog.Logger

	mu      sync.Mutex
	stamps  filestamp.Set // of the files as last loaded or tried
	checked time.Time
	cert    *tls.Certificate
	fp      string
}

// newCertReloader loads the pair now; an error fails Listen.
func newCertReloader(certFile, keyFile string, log *slog.Logger) (*certReloader, error) {
	r := &certReloader{certFile: certFile, keyFile: keyFile, log: log}
	r.stamps = filestamp.All([]string{certFile, keyFile})
	cert, _, err := loadKeyPair(certFile, keyFile, "listen")
	if err != nil {
		return nil, err
	}
	fp, err := leafFingerprint(&cert)
	if err != nil {
		return nil, err
	}
	r.cert, r.fp, r.checked = &cert, fp, time.Now()
	return r, nil
}

// current returns the certificate to serve and its fingerprint, first
// loading the files again if they changed since the last look, which is
// at least CertCheckInterval old.
func (r *certReloader) current() (*tls.Certificate, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := time.Now(); now.Sub(r.checked) >= CertCheckInterval {
		r.checked = now
		if st := filestamp.All([]string{r.certFile, r.keyFile}); !st.Equal(r.stamps) {
			r.stamps = st
			r.reloadLocked()
		}
	}
	return r.cert, r.fp
}

func (r *certReloader) reloadLocked() {
	cert, _, err := loadKeyPair(r.certFile, r.keyFile, "listen")
	var fp string
	if err == nil {
		fp, err = leafFingerprint(&cert)
	}
	if err != nil {
		r.log.Warn("weida: the endpoint's certificate files changed and cannot be loaded; new connections still get the previous certificate",
			"err", err, "fingerprint", r.fp)
		return
	}
	if fp != r.fp {
		r.log.Warn("weida: the endpoint's certificate files hold a new key: subscribers pinning the previous fingerprint will be refused",
			"fingerprint", fp, "previous", r.fp)
	}
	r.cert, r.fp = &cert, fp
	r.log.Info("weida: reloaded the endpoint's certificate; new connections get it", "cert_file", r.certFile, "fingerprint", fp)
}

func (r *certReloader) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c, _ := r.current()
	return c, nil
}

// serverTLS builds the TLS configuration of a listener on addr and returns
// its fingerprint and whether the certificate is self-signed by this
// package (generated now or kept in cfg.StateDir), and, with CertFile and
// KeyFile, the reloader serving them. Clients refused by auth (built from
// cfg.ClientFingerprints, ClientIdentities and ClientCAFile) are logged
// and counted in refused.
//
// Its steps (where the identity comes from, how clients are verified,
// what reloads the files) build one tls.Config and decide together what a
// restarted listener presents, so they read in one place.
func serverTLS(addr string, cfg *ListenConfig, auth *clientAuth, log *slog.Logger, refused *atomic.Uint64, proofs *proofs) (*tls.Config, string, bool, *certReloader, error) {
	var reload *certReloader
	if cfg.CertFile != "" || cfg.KeyFile != "" {
		if cfg.CertFile == "" || cfg.KeyFile == "" {
			_, _, err := loadKeyPair(cfg.CertFile, cfg.KeyFile, "listen") // says which is missing
			return nil, "", false, nil, err
		}
		var err error
		if reload, err = newCertReloader(cfg.CertFile, cfg.KeyFile, log); err != nil {
			return nil, "", false, nil, err
		}
	}
	var cert tls.Certificate
	var err error
	ok := reload != nil
	if ok {
		cert = *reload.cert
	}
	generated := !ok
	switch {
	case ok:
	case cfg.StateDir != "":
		if cert, _, err = stateIdentity(cfg.StateDir, addr, log); err != nil {
			return nil, "", false, nil, err
		}
	default:
		if cert, err = selfSigned(); err != nil {
			return nil, "", false, nil, err
		}
	}
	fp, err := leafFingerprint(&cert)
	if err != nil {
		return nil, "", false, nil, err
	}
	base := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		NextProtos:   []string{ALPN},
		// Request a certificate so that one presented proves an identity;
		// crypto/tls does not verify its chain, because weida identifies a
		// peer by its key (the CertificateVerify message proves possession
		// of it). A chain to ClientCAFile is verified by admitClient, for
		// the clients that are admitted by a CA-issued identity only.
		//
		// An allowlist does not change this to RequireAnyClientCert:
		// crypto/tls would then refuse a client without a certificate
		// itself, before VerifyConnection runs, and that refusal would
		// be neither logged nor counted. VerifyConnection refuses it
		// instead, so every refusal passes through admitClient.
		ClientAuth: tls.RequestClientCert,
	}
	if auth.enabled() {
		// GetConfigForClient gives the verification callback the remote
		// address to log.
		base.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			c := base.Clone()
			c.GetConfigForClient = nil
			remote := ""
			if hello.Conn != nil {
				remote = hello.Conn.RemoteAddr().String()
			}
			c.VerifyConnection = func(cs tls.ConnectionState) error {
				err := admitClient(cs.PeerCertificates, auth, remote, log, refused)
				if err == nil {
					proofs.await(remote, Fingerprint(cs.PeerCertificates[0]))
				}
				return err
			}
			return c, nil
		}
	}
	if reload != nil {
		// Every handshake asks the reloader, so that certificate files
		// replaced on disk (a renewal, a rotation) reach new connections
		// without a restart; connections already open keep theirs.
		base.Certificates = nil
		base.GetCertificate = reload.getCertificate
	}
	return base, fp, generated, reload, nil
}

// certificateProofWait is how long after the allowlist admits a client's
// certificate its handshake must complete before the certificate counts as
// not proven. The proof comes in the same flight as the certificate, so this
// only needs to outlast a slow handshake; tests shorten it.
var certificateProofWait atomic.Int64

func init() { certificateProofWait.Store(int64(10 * time.Second)) }

// proofs watches the handshakes whose certificate the allowlist admitted.
//
// crypto/tls calls VerifyConnection, where the allowlist decides, before it
// checks that the client holds the certificate's key (CertificateVerify),
// and fails the handshake by itself when it does not: the listener then
// never sees the connection. A handshake admitted here and not accepted by
// the listener within certificateProofWait is therefore counted and logged
// as a refused client, so that a copied certificate does not go unnoticed.
type proofs struct {
	log     *slog.Logger
	refused *atomic.Uint64

	mu      sync.Mutex
	pending map[string]*time.Timer // by remote address
	closed  bool
}

func newProofs(log *slog.Logger, refused *atomic.Uint64) *proofs {
	return &proofs{log: log, refused: refused, pending: make(map[string]*time.Timer)}
}

func (p *proofs) await(remote, fingerprint string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	if old := p.pending[remote]; old != nil {
		old.Stop()
	}
	var t *time.Timer
	t = time.AfterFunc(time.Duration(certificateProofWait.Load()), func() {
		p.mu.Lock()
		if p.pending[remote] != t {
			p.mu.Unlock()
			return
		}
		delete(p.pending, remote)
		p.mu.Unlock()
		p.refused.Add(1)
		p.log.Warn("weida: refused client", "reason", "key not proven (the handshake failed after the certificate was admitted)",
			"fingerprint", fingerprint, "remote", remote)
	})
	p.pending[remote] = t
}

// completed is called for every connection the listener accepts.
func (p *proofs) completed(remote string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t := p.pending[remote]; t != nil {
		t.Stop()
		delete(p.pending, remote)
	}
}

func (p *proofs) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for r, t := range p.pending {
		t.Stop()
		delete(p.pending, r)
	}
}

// admitClient decides whether a client presenting certs (leaf first) is
// admitted by auth, by a listed fingerprint or a listed identity of a
// certificate the client CA issued. A refusal is logged and counted, and
// its error fails the TLS handshake: crypto/tls sends the bad_certificate
// alert (42) for any error of VerifyConnection, so the client learns
// nothing but that it was refused, and no weida frame of it is ever read.
func admitClient(certs []*x509.Certificate, auth *clientAuth, remote string, log *slog.Logger, refused *atomic.Uint64) error {
	names, reason := auth.identify(certs, time.Now())
	if len(names) > 0 {
		return nil
	}
	refused.Add(1)
	if len(certs) == 0 {
		log.Warn("weida: refused client", "reason", reason, "remote", remote)
		return errors.New("weida: a client certificate is required")
	}
	got := Fingerprint(certs[0])
	log.Warn("weida: refused client", "reason", reason, "fingerprint", got, "remote", remote)
	return fmt.Errorf("weida: client %s is not admitted", got)
}

// clientTLS builds the dialler's TLS configuration for a parsed address,
// and returns the fingerprint of the client certificate it presents ("" for
// none).
//
// Trust, strongest first: a fingerprint pinned in the URL (the chain and the
// names are ignored, only the key counts); a CA file (the chain must reach it
// and name the URL's host); the explicitly named test option. Without any of
// them dialling is refused with an error that says how to pin.
func clientTLS(a address.Address, cfg *DialConfig) (*tls.Config, string, error) {
	c := &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: []string{ALPN},
		ServerName: a.Host,
	}
	cert, ok, err := loadKeyPair(cfg.CertFile, cfg.KeyFile, "dial")
	if err != nil {
		return nil, "", err
	}
	clientFP := ""
	if ok {
		if clientFP, err = leafFingerprint(&cert); err != nil {
			return nil, "", fmt.Errorf("weida: dial: %s: %w", cfg.CertFile, err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	switch {
	case a.Fingerprint != "":
		pin := a.Fingerprint
		// The standard verification is replaced, not skipped: the callback
		// below refuses every key but the pinned one.
		c.InsecureSkipVerify = true
		c.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 {
				return errors.New("weida: publisher presented no certificate")
			}
			got, err := fingerprintDER(raw[0])
			if err != nil {
				return err
			}
			if got != pin {
				return fmt.Errorf("%w: it presented %s, the URL pins %s", ErrFingerprintMismatch, got, pin)
			}
			return nil
		}
	case cfg.CAFile != "":
		pem, err := safefile.ReadFile(cfg.CAFile, MaxPEMFileBytes)
		if err != nil {
			return nil, "", fmt.Errorf("weida: dial: reading CAFile: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, "", fmt.Errorf("weida: dial: CAFile %s holds no PEM certificate", cfg.CAFile)
		}
		c.RootCAs = pool
	case cfg.InsecureSkipVerifyForTesting:
		c.InsecureSkipVerify = true
	default:
		return nil, "", fmt.Errorf("%w at %s: pin its fingerprint in the URL "+
			"(weida://sha256:<hex>@%s%s, the listener logs and prints it) or set DialConfig.CAFile",
			ErrNoTrust, a.HostPort(), a.HostPort(), a.Path)
	}
	return c, clientFP, nil
}
