package weida

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"weida.dev/connector/internal/filestamp"
	"weida.dev/connector/internal/safefile"
	"weida.dev/connector/weida/address"
)

// clientAuth decides which clients a listener admits, and under which
// names its Scopes know them: a listed fingerprint (ClientFingerprints),
// and every listed identity (ClientIdentities) that a certificate issued
// by ClientCAFile carries. Safe for concurrent use; the CA file is
// reloaded as the endpoint's certificate files are.
type clientAuth struct {
	fingerprints map[string]bool
	identities   map[string]bool
	ca           *caReloader // nil without ClientCAFile
}

func newClientAuth(cfg *ListenConfig, log *slog.Logger) (*clientAuth, error) {
	a := &clientAuth{
		fingerprints: make(map[string]bool, len(cfg.ClientFingerprints)),
		identities:   make(map[string]bool, len(cfg.ClientIdentities)),
	}
	var errs []error
	for _, f := range cfg.ClientFingerprints {
		if err := address.ValidateFingerprint(f); err != nil {
			errs = append(errs, fmt.Errorf("weida: ListenConfig.ClientFingerprints: %q: %w", f, err))
		}
		a.fingerprints[f] = true
	}
	for _, id := range cfg.ClientIdentities {
		if err := address.ValidateIdentity(id); err != nil {
			errs = append(errs, fmt.Errorf("weida: ListenConfig.ClientIdentities: %q: %w", id, err))
		}
		a.identities[id] = true
	}
	// Either without the other admits nobody it names: say so rather
	// than run an endpoint that refuses the clients meant for it.
	switch {
	case len(a.identities) > 0 && cfg.ClientCAFile == "":
		errs = append(errs, errors.New("weida: ListenConfig.ClientIdentities needs ClientCAFile, the CA that issues them"))
	case len(a.identities) == 0 && cfg.ClientCAFile != "":
		errs = append(errs, errors.New("weida: ListenConfig.ClientCAFile needs ClientIdentities: the CA alone admits no client"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.ClientCAFile != "" {
		ca, err := newCAReloader(cfg.ClientCAFile, log)
		if err != nil {
			return nil, err
		}
		a.ca = ca
	}
	return a, nil
}

// enabled reports whether clients must prove a listed name to connect.
func (a *clientAuth) enabled() bool { return len(a.fingerprints) > 0 || len(a.identities) > 0 }

// identify returns the names, sorted, under which the client presenting
// certs (leaf first) is admitted: its fingerprint when listed, and each
// listed identity of its leaf when the leaf chains to the client CA for
// client authentication at now. None means refused, and reason says why.
func (a *clientAuth) identify(certs []*x509.Certificate, now time.Time) (names []string, reason string) {
	if len(certs) == 0 {
		return nil, "no certificate"
	}
	leaf := certs[0]
	if fp := Fingerprint(leaf); a.fingerprints[fp] {
		names = append(names, fp)
	}
	if a.ca != nil {
		ids := certIdentities(leaf)
		listed := slices.ContainsFunc(ids, func(id string) bool { return a.identities[id] })
		switch {
		case !listed && len(names) == 0:
			reason = "no listed fingerprint or identity"
		case !listed:
		default:
			inter := x509.NewCertPool()
			for _, c := range certs[1:] {
				inter.AddCert(c)
			}
			_, err := leaf.Verify(x509.VerifyOptions{
				Roots:         a.ca.current(),
				Intermediates: inter,
				KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
				CurrentTime:   now,
			})
			if err != nil {
				reason = "certificate not verified by the client CA: " + err.Error()
				break
			}
			for _, id := range ids {
				if a.identities[id] {
					names = append(names, id)
				}
			}
		}
	}
	if len(names) > 0 {
		slices.Sort(names)
		return slices.Compact(names), ""
	}
	if reason == "" {
		reason = "fingerprint not listed"
	}
	return nil, reason
}

// certIdentities returns the identities a certificate carries, in the
// text form of [address.ValidateIdentity]: each DNS, URI and email
// subject alternative name, and the subject's CommonName. Nothing is
// normalised: a listed identity matches only a value written the same
// way, byte for byte.
func certIdentities(c *x509.Certificate) []string {
	ids := make([]string, 0, len(c.DNSNames)+len(c.URIs)+len(c.EmailAddresses)+1)
	for _, n := range c.DNSNames {
		ids = append(ids, "dns:"+n)
	}
	for _, u := range c.URIs {
		ids = append(ids, "uri:"+u.String())
	}
	for _, e := range c.EmailAddresses {
		ids = append(ids, "email:"+e)
	}
	if c.Subject.CommonName != "" {
		ids = append(ids, "cn:"+c.Subject.CommonName)
	}
	return ids
}

// loadClientCA reads a PEM file of CA certificates. Every CERTIFICATE
// block must parse and be a CA (basic constraints, CA true): a leaf put
// there by mistake would quietly admit itself, and any certificate it
// signed, which is not what a file of trust anchors promises. At least
// one is required; blocks of other types are ignored.
func loadClientCA(file string) (*x509.CertPool, int, error) {
	data, err := safefile.ReadFile(file, MaxPEMFileBytes)
	if err != nil {
		return nil, 0, fmt.Errorf("weida: ClientCAFile: %w", err)
	}
	pool := x509.NewCertPool()
	n := 0
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, 0, fmt.Errorf("weida: ClientCAFile %s: certificate %d: %w", file, n+1, err)
		}
		if !c.BasicConstraintsValid || !c.IsCA {
			return nil, 0, fmt.Errorf("weida: ClientCAFile %s: certificate %d (%s) is not a CA certificate", file, n+1, c.Subject)
		}
		pool.AddCert(c)
		n++
	}
	if n == 0 {
		return nil, 0, fmt.Errorf("weida: ClientCAFile %s holds no PEM certificate", file)
	}
	return pool, n, nil
}

// caReloader serves the client CA pool from ClientCAFile, loading it
// again when its stamp changes, at most every [CertCheckInterval] and
// only when a client asks (as certReloader does for the endpoint's own
// files). A file that fails to load is logged and the previous pool kept
// until the file changes again. Safe for concurrent use.
type caReloader struct {
	file string
	log  *slog.Logger

	mu      sync.Mutex
	stamps  filestamp.Set
	checked time.Time
	pool    *x509.CertPool
}

// newCAReloader loads the file now; an error fails Listen.
func newCAReloader(file string, log *slog.Logger) (*caReloader, error) {
	r := &caReloader{file: file, log: log, stamps: filestamp.All([]string{file})}
	pool, _, err := loadClientCA(file)
	if err != nil {
		return nil, err
	}
	r.pool, r.checked = pool, time.Now()
	return r, nil
}

func (r *caReloader) current() *x509.CertPool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := time.Now(); now.Sub(r.checked) >= CertCheckInterval {
		r.checked = now
		if st := filestamp.All([]string{r.file}); !st.Equal(r.stamps) {
			r.stamps = st
			pool, n, err := loadClientCA(r.file)
			if err != nil {
				r.log.Warn("weida: the client CA file changed and cannot be loaded; new connections are still verified against the previous one",
					"err", err)
			} else {
				r.pool = pool
				r.log.Info("weida: reloaded the client CA file; new connections are verified against it", "client_ca_file", r.file, "certificates", n)
			}
		}
	}
	return r.pool
}
