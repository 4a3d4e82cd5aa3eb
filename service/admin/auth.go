package admin

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"unicode"

	"weida.dev/connector/internal/filestamp"
	"weida.dev/connector/internal/safefile"
)

// Realm is the realm of the admin listener's authentication challenges;
// a browser shows it in its password prompt.
const Realm = "weida-connector"

// maxTokenBytes bounds a token file: a token is a line of a few dozen
// characters, and anything much larger is the wrong file.
const maxTokenBytes = 4096

// ErrBadToken is wrapped by the errors of a token file that holds no
// usable token: empty, or with spaces or control characters inside it.
var ErrBadToken = errors.New("admin: no usable token")

// TokenFile is the admin token, read from a file and read again whenever
// the file changes (by its [filestamp]: a Kubernetes Secret volume's
// atomic swap, a rename over it, an edit), so that a rotated token takes
// effect at the next request without a restart or a signal. A file that
// changes into something unusable (missing, empty, unreadable) is logged
// and the last good token stays in force until the file changes again.
//
// Only a SHA-256 digest of the token is kept; the token itself is never
// logged. Safe for concurrent use.
type TokenFile struct {
	path string
	log  *slog.Logger

	mu    sync.Mutex
	stamp filestamp.Stamp // of the file as last read or tried
	sum   [sha256.Size]byte
}

// OpenTokenFile reads the token of path. It fails, wrapping
// [ErrBadToken] or the read error, when the file holds no usable token:
// a listener must not start with a protection that does not work. log
// receives the reloads; nil means slog.Default().
//
// The token is the file's content with surrounding white space (a final
// newline, say) removed.
func OpenTokenFile(path string, log *slog.Logger) (*TokenFile, error) {
	if log == nil {
		log = slog.Default()
	}
	f := &TokenFile{path: path, log: log, stamp: filestamp.Of(path)}
	tok, err := readToken(path)
	if err != nil {
		return nil, err
	}
	f.sum = sha256.Sum256(tok)
	return f, nil
}

// Path is the file the token is read from.
func (f *TokenFile) Path() string { return f.path }

// current returns the digest of the token in force, first reading the
// file again when its stamp changed. One stat a request costs less than
// the request, and makes a rotation immediate.
func (f *TokenFile) current() [sha256.Size]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	if st := filestamp.Of(f.path); st != f.stamp {
		f.stamp = st
		tok, err := readToken(f.path)
		if err != nil {
			f.log.Warn("admin: the token file changed and holds no usable token; the previous token stays in force until it changes again",
				"file", f.path, "err", err)
		} else if sum := sha256.Sum256(tok); sum != f.sum {
			f.sum = sum
			f.log.Info("admin: the token file changed; the new token is in force", "file", f.path)
		}
	}
	return f.sum
}

// readToken reads the token of path. Its errors never quote the file's
// content.
func readToken(path string) ([]byte, error) {
	b, err := safefile.ReadFile(path, maxTokenBytes)
	if err != nil {
		return nil, fmt.Errorf("admin token file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return nil, fmt.Errorf("admin token file %s: %w: the file is empty", path, ErrBadToken)
	}
	// A space, newline or control character inside the token cannot be
	// sent in a Bearer header and usually means the wrong file (a
	// certificate, several keys).
	if strings.ContainsFunc(tok, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) {
		return nil, fmt.Errorf("admin token file %s: %w: it holds white space or control characters inside the token", path, ErrBadToken)
	}
	return []byte(tok), nil
}

// RequireToken serves h to requests that present the token of f, and
// the probes of [Handler] (/healthz, /readyz, /readyz/{resource}) to
// everyone, so that a kubelet needs no secret. A request shows the token
// as `Authorization: Bearer TOKEN` (Prometheus, curl) or as the password
// of HTTP Basic authentication under any user name (a browser, which
// prompts for it). Any other request is answered 401 with a Bearer and a
// Basic challenge.
//
// The probes are told apart by the same patterns h's mux serves them
// under, so a path that reaches a probe in h is exactly one that skips the
// token here.
func RequireToken(h http.Handler, f *TokenFile) http.Handler {
	mux := http.NewServeMux()
	for _, p := range []string{"GET /healthz", "GET /readyz", "GET /readyz/{resource}"} {
		mux.Handle(p, h)
	}
	mux.Handle("/", http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if !authorized(req, f.current()) {
			w.Header().Add("WWW-Authenticate", `Bearer realm="`+Realm+`"`)
			w.Header().Add("WWW-Authenticate", `Basic realm="`+Realm+`", charset="UTF-8"`)
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte("unauthorized: this path of the admin listener needs its token " +
				"(Authorization: Bearer TOKEN, or any user name with the token as password)\n"))
			return
		}
		h.ServeHTTP(w, req)
	}))
	return mux
}

// authorized reports whether req presents the token whose digest is
// want. Digests are compared, in constant time, so that neither the
// token's bytes nor its length show in how long a refusal takes.
func authorized(req *http.Request, want [sha256.Size]byte) bool {
	var got string
	if _, pass, ok := req.BasicAuth(); ok {
		got = pass
	} else if v, ok := cutPrefixFold(req.Header.Get("Authorization"), "Bearer "); ok {
		got = strings.TrimSpace(v)
	} else {
		return false
	}
	sum := sha256.Sum256([]byte(got))
	return subtle.ConstantTimeCompare(sum[:], want[:]) == 1
}

// cutPrefixFold is strings.CutPrefix ignoring case: the scheme of an
// Authorization header is case-insensitive (RFC 9110, 11.1).
func cutPrefixFold(s, prefix string) (string, bool) {
	if len(s) < len(prefix) || !strings.EqualFold(s[:len(prefix)], prefix) {
		return s, false
	}
	return s[len(prefix):], true
}
