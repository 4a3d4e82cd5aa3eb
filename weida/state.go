package weida

import (
	"bytes"
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/quic-go/quic-go"

	"weida.dev/connector/internal/safefile"
)

// ResetKeyFile is the name, inside a listener's StateDir, of the QUIC
// stateless reset key: 32 random bytes, mode 0600.
const ResetKeyFile = "stateless-reset.key"

// StateFiles returns the certificate and key files a listener on addr
// ("host:port", as given to [Listen]) keeps in dir when its ListenConfig
// names no CertFile and KeyFile: dir/endpoint-<host>-<port>.crt and .key.
//
// The name is derived from the address as written, not as resolved, so it
// stays the same across restarts: "127.0.0.1:7101" gives
// endpoint-127.0.0.1-7101, "[::1]:7101" gives endpoint-__1-7101 and
// ":7101" gives endpoint--7101. The host is lowercased; ASCII letters,
// digits, '.' and '-' are kept, ':' becomes '_', and any other byte becomes
// %XX (a zone "%eth0" becomes %25eth0). The port keeps only letters and
// digits, so the last '-' always separates it and two addresses never share
// a name. A listener on port 0 therefore keeps one identity for all its
// starts, whatever port it is given.
func StateFiles(dir, addr string) (certFile, keyFile string, err error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", "", fmt.Errorf("weida: state files for %q: %w", addr, err)
	}
	base := "endpoint-" + stateName(strings.ToLower(host), true) + "-" + stateName(port, false)
	return filepath.Join(dir, base+".crt"), filepath.Join(dir, base+".key"), nil
}

// stateName escapes s for a file name; see StateFiles.
func stateName(s string, host bool) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
			b.WriteByte(c)
		case host && (c == '.' || c == '-'):
			b.WriteByte(c)
		case host && c == ':':
			b.WriteByte('_')
		default:
			fmt.Fprintf(&b, "%%%02x", c)
		}
	}
	return b.String()
}

// stateDir creates dir (0700) when it is missing.
func stateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("weida: state dir: %w", err)
	}
	return nil
}

// stateIdentity returns the listener identity kept in dir for addr,
// generating and writing it when neither file exists. generated reports
// that this call created the key.
//
// Its cases are the four combinations of the two files on disk plus the
// race with another listener; each ends in its own operator-facing error,
// so they stay side by side rather than behind helpers.
func stateIdentity(dir, addr string, log *slog.Logger) (cert tls.Certificate, generated bool, err error) {
	if err := stateDir(dir); err != nil {
		return tls.Certificate{}, false, err
	}
	certFile, keyFile, err := StateFiles(dir, addr)
	if err != nil {
		return tls.Certificate{}, false, err
	}
	keyPEM, err := readState(keyFile)
	if err != nil {
		return tls.Certificate{}, false, err
	}
	certPEM, err := readState(certFile)
	if err != nil {
		return tls.Certificate{}, false, err
	}
	switch {
	case certPEM != nil && keyPEM == nil:
		return tls.Certificate{}, false, fmt.Errorf("weida: state dir: %s exists but its key %s does not: "+
			"restore the key from a backup, or delete %s to generate a new identity "+
			"(every subscriber must then pin the new fingerprint)", certFile, keyFile, certFile)
	case keyPEM == nil:
		key, err := newKey()
		if err != nil {
			return tls.Certificate{}, false, err
		}
		if keyPEM, err = keyToPEM(key); err != nil {
			return tls.Certificate{}, false, err
		}
		// Exclusive: should another listener have written a key in the
		// meantime, its key is the identity and ours is discarded.
		created, err := writeState(keyFile, keyPEM, 0o600)
		if err != nil {
			return tls.Certificate{}, false, err
		}
		if !created {
			if keyPEM, err = readState(keyFile); err != nil {
				return tls.Certificate{}, false, err
			}
		}
		generated = created
	}
	if keyPEM != nil && certPEM == nil {
		// The fingerprint depends on the key alone, so a certificate made
		// now for a kept key (after a crash between the two writes, or a
		// deleted certificate) keeps every pin working.
		key, err := parseKeyPEM(keyPEM)
		if err != nil {
			return tls.Certificate{}, false, corruptIdentity(certFile, keyFile, keyFile, err)
		}
		der, err := selfSignedDER(key)
		if err != nil {
			return tls.Certificate{}, false, err
		}
		certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
		created, err := writeState(certFile, certPEM, 0o644)
		if err != nil {
			return tls.Certificate{}, false, err
		}
		if !created {
			if certPEM, err = readState(certFile); err != nil {
				return tls.Certificate{}, false, err
			}
		}
	}
	cert, err = tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, false, corruptIdentity(certFile, keyFile, certFile+" or "+keyFile, err)
	}
	if fi, err := os.Stat(keyFile); err == nil && fi.Mode().Perm()&0o077 != 0 {
		log.Warn("weida: the endpoint key is readable by other users", "file", keyFile, "mode", fi.Mode().Perm().String())
	}
	if generated {
		fp, _ := leafFingerprint(&cert)
		log.Info("weida: generated a new endpoint identity", "cert_file", certFile, "key_file", keyFile, "fingerprint", fp)
	}
	return cert, generated, nil
}

func corruptIdentity(certFile, keyFile, which string, err error) error {
	return fmt.Errorf("weida: state dir: cannot use the endpoint identity in %s: %w; "+
		"restore %s and %s from a backup, or delete both to generate a new identity "+
		"(every subscriber must then pin the new fingerprint)", which, err, certFile, keyFile)
}

// stateResetKey returns the stateless reset key kept in dir, generating
// and writing it when missing.
func stateResetKey(dir string) (*quic.StatelessResetKey, error) {
	if err := stateDir(dir); err != nil {
		return nil, err
	}
	file := filepath.Join(dir, ResetKeyFile)
	b, err := readState(file)
	if err != nil {
		return nil, err
	}
	if b == nil {
		k, err := randomResetKey()
		if err != nil {
			return nil, err
		}
		created, err := writeState(file, k[:], 0o600)
		if err != nil {
			return nil, err
		}
		if created {
			return k, nil
		}
		if b, err = readState(file); err != nil { // another listener wrote it first
			return nil, err
		}
	}
	var k quic.StatelessResetKey
	if len(b) != len(k) {
		return nil, fmt.Errorf("weida: state dir: %s holds %d bytes, not %d: delete it to generate a new key "+
			"(connections of the previous process then end by their idle timeout instead of a reset)",
			file, len(b), len(k))
	}
	copy(k[:], b)
	return &k, nil
}

// ResetKeyError is a reset key file ([ListenConfig].ResetKeyFile) that
// cannot be used. Listen and [CheckResetKeyFile] return it.
type ResetKeyError struct {
	File string
	// Size is the number of bytes the file holds.
	Size int
	// Rule is what the file breaks.
	Rule string
}

func (e *ResetKeyError) Error() string {
	return fmt.Sprintf("weida: reset key file %s (%d bytes): %s; the file must hold 32 bytes, "+
		"or 64 hex digits and at most one trailing newline: create it with `openssl rand -hex 32 > %s` "+
		"(or `head -c 32 /dev/urandom`) and give every replica serving the same endpoints the same file",
		e.File, e.Size, e.Rule, e.File)
}

// CheckResetKeyFile reads file as [ListenConfig].ResetKeyFile would and
// returns why it cannot be used: a *ResetKeyError, or the read's error. A
// caller checks it at start-up, so that a bad file is refused once rather
// than failing every Listen.
func CheckResetKeyFile(file string) error {
	_, err := fileResetKey(file)
	return err
}

// fileResetKey reads the stateless reset key an operator shares between
// replicas: exactly 32 bytes (a Kubernetes Secret's data decodes to them),
// or 64 hex digits with at most one trailing newline (what `openssl rand
// -hex 32` prints, and what fits a Secret's stringData). Both are accepted
// because both are what the usual tools produce; anything else is refused
// rather than hashed into a key, so that two replicas given files that
// differ only by accident cannot end up with keys that differ silently.
func fileResetKey(file string) (*quic.StatelessResetKey, error) {
	b, err := safefile.ReadFile(file, MaxPEMFileBytes)
	if err != nil {
		return nil, fmt.Errorf("weida: reset key file: %w (check the path, the file's owner and mode)", err)
	}
	var k quic.StatelessResetKey
	digits := bytes.TrimSuffix(bytes.TrimSuffix(b, []byte("\n")), []byte("\r"))
	switch {
	case len(b) == len(k) && printable(b):
		// 32 random bytes are all printable ASCII about once in 10^14
		// keys; a file of 32 printable bytes is text: a placeholder, a
		// phrase, or 16 bytes written as hex without the newline.
		return nil, &ResetKeyError{File: file, Size: len(b), Rule: "its 32 bytes are all printable text, a placeholder or a phrase rather than random bytes"}
	case len(b) == len(k):
		copy(k[:], b)
	case len(digits) == 2*len(k):
		if _, err := hex.Decode(k[:], digits); err != nil {
			return nil, &ResetKeyError{File: file, Size: len(b), Rule: "it has 64 characters, but not all are hex digits"}
		}
	default:
		return nil, &ResetKeyError{File: file, Size: len(b), Rule: "it holds neither 32 bytes nor 64 hex digits"}
	}
	if k == (quic.StatelessResetKey{}) {
		return nil, &ResetKeyError{File: file, Size: len(b), Rule: "the key is all zeros, a placeholder rather than a secret"}
	}
	return &k, nil
}

// printable reports whether every byte of b is printable ASCII or a
// newline.
func printable(b []byte) bool {
	for _, c := range b {
		if (c < ' ' || c > '~') && c != '\n' && c != '\r' && c != '\t' {
			return false
		}
	}
	return true
}

func randomResetKey() (*quic.StatelessResetKey, error) {
	var k quic.StatelessResetKey
	if _, err := rand.Read(k[:]); err != nil {
		return nil, fmt.Errorf("weida: generating the stateless reset key: %w", err)
	}
	return &k, nil
}

// processResetKey is the stateless reset key of listeners without a
// StateDir: one per process rather than per listener, so that a listener
// closed and listening again on the same address in this process resets
// the old connections' packets. It is computed once and never changes.
var processResetKey = sync.OnceValues(randomResetKey)

// readState returns the contents of file, nil when it does not exist.
func readState(file string) ([]byte, error) {
	b, err := safefile.ReadFile(file, MaxPEMFileBytes)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("weida: state dir: %w (check the file's owner and mode)", err)
	}
	return b, nil
}

// writeState creates file with data and perm, atomically, never replacing
// an existing file: created is false when file already existed, and then
// data was not written.
func writeState(file string, data []byte, perm fs.FileMode) (created bool, err error) {
	switch err := safefile.Create(file, data, perm, false); {
	case err == nil:
		return true, nil
	case errors.Is(err, safefile.ErrExists):
		return false, nil
	default:
		return false, fmt.Errorf("weida: state dir: %w", err)
	}
}

// GenerateIdentity generates a weida endpoint identity, the kind a listener
// without certificate files uses: an ECDSA P-256 key and a self-signed
// certificate for it, valid for ten years. It returns both PEM-encoded (the
// key as PKCS #8, "PRIVATE KEY") and the certificate's fingerprint, which
// subscribers pin. Pinning subscribers ignore the certificate's names and
// dates; only the key counts.
func GenerateIdentity() (certPEM, keyPEM []byte, fingerprint string, err error) {
	key, err := newKey()
	if err != nil {
		return nil, nil, "", err
	}
	der, err := selfSignedDER(key)
	if err != nil {
		return nil, nil, "", err
	}
	keyPEM, err = keyToPEM(key)
	if err != nil {
		return nil, nil, "", err
	}
	fingerprint, err = fingerprintDER(der)
	if err != nil {
		return nil, nil, "", err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, fingerprint, nil
}

// FingerprintPEM returns the fingerprint of the first certificate in a PEM
// file's contents (the leaf, in a chain), skipping any other PEM block
// before it. It fails when there is no parsable certificate.
func FingerprintPEM(data []byte) (string, error) {
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return "", errors.New("weida: no PEM CERTIFICATE block found")
		}
		if b.Type == "CERTIFICATE" {
			return fingerprintDER(b.Bytes)
		}
	}
}

func keyToPEM(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("weida: encoding key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// parseKeyPEM parses a private key the way tls.X509KeyPair accepts one.
func parseKeyPEM(data []byte) (crypto.Signer, error) {
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return nil, errors.New("no PEM private key block found")
		}
		if b.Type != "PRIVATE KEY" && !strings.HasSuffix(b.Type, " PRIVATE KEY") {
			continue
		}
		if k, err := x509.ParsePKCS8PrivateKey(b.Bytes); err == nil {
			if s, ok := k.(crypto.Signer); ok {
				return s, nil
			}
			return nil, fmt.Errorf("unsupported private key type %T", k)
		}
		if k, err := x509.ParseECPrivateKey(b.Bytes); err == nil {
			return k, nil
		}
		if k, err := x509.ParsePKCS1PrivateKey(b.Bytes); err == nil {
			return k, nil
		}
		return nil, errors.New("the PEM private key block does not parse")
	}
}
