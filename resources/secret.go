package resources

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"

	"weida.dev/connector/internal/safefile"
)

// SecretRef says where a secret lives: an environment variable or a file.
// It never holds the secret itself, so printing it is safe. Exactly one of
// Env and File is set; the zero value means "no secret".
type SecretRef struct {
	Env  string `json:"env,omitempty"`  // name of an environment variable
	File string `json:"file,omitempty"` // path of a file; relative paths were made relative to the resource file's directory
}

// IsZero reports whether r refers to nothing.
func (r SecretRef) IsZero() bool { return r.Env == "" && r.File == "" }

// String describes the reference, e.g. "env MQTT_PASSWORD", never a value.
func (r SecretRef) String() string {
	switch {
	case r.Env != "":
		return "env " + r.Env
	case r.File != "":
		return "file " + r.File
	default:
		return "none"
	}
}

// Resolver reads secrets when a connector starts a resource, and again at
// each of its connection attempts: loading and checking resources never
// reads a secret. The zero value reads the
// process environment and the operating system's files.
type Resolver struct {
	// LookupEnv reads an environment variable; nil means os.LookupEnv.
	LookupEnv func(name string) (string, bool)
	// ReadFile reads a file; nil reads only regular files, refusing a
	// pipe or a device before opening it (see [Resolver.Resolve]). Whatever
	// it is, a secret longer than [MaxSecretBytes] is refused.
	ReadFile func(path string) ([]byte, error)
}

// MaxSecretBytes is the largest secret a file may hold: far more than any
// password, token or credentials file, and small enough that a wrong path
// (a log, an image) fails at once.
const MaxSecretBytes = 1 << 20

// ErrSecret is wrapped by every error Resolve returns. The errors name the
// reference, never a value.
var ErrSecret = errors.New("resources: secret unavailable")

// Resolve reads the secret ref points to. A file's single trailing newline
// ("\n" or "\r\n") is removed, since editors and `echo` add one. An unset
// variable, an unreadable file and an empty secret are errors, and so are a
// file that is not a regular file (a named pipe, which could block the
// reader forever, or a device such as /dev/zero, which never ends: the
// error wraps a [*safefile.NotRegularError]) and one larger than
// [MaxSecretBytes] (a [*safefile.TooLargeError]). Resolving the zero
// SecretRef returns the zero Secret and no error.
func (r Resolver) Resolve(ref SecretRef) (Secret, error) {
	switch {
	case ref.Env != "":
		lookup := r.LookupEnv
		if lookup == nil {
			lookup = os.LookupEnv
		}
		v, ok := lookup(ref.Env)
		if !ok {
			return Secret{}, fmt.Errorf("%w: environment variable %s is not set", ErrSecret, ref.Env)
		}
		if v == "" {
			return Secret{}, fmt.Errorf("%w: environment variable %s is empty", ErrSecret, ref.Env)
		}
		return NewSecret(v), nil
	case ref.File != "":
		read := r.ReadFile
		if read == nil {
			read = func(p string) ([]byte, error) { return safefile.ReadFile(p, MaxSecretBytes) }
		}
		b, err := read(ref.File)
		if err == nil && len(b) > MaxSecretBytes {
			err = &safefile.TooLargeError{Path: ref.File, Limit: MaxSecretBytes}
		}
		if safefile.Refused(err) {
			return Secret{}, fmt.Errorf("%w: %w", ErrSecret, err) // the error names the path
		}
		if err != nil {
			// Keep the OS reason only: a *fs.PathError would repeat the path.
			var pe *fs.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			return Secret{}, fmt.Errorf("%w: file %s: %w", ErrSecret, ref.File, err)
		}
		v := string(b)
		if s, ok := strings.CutSuffix(v, "\n"); ok {
			v, _ = strings.CutSuffix(s, "\r")
		}
		if v == "" {
			return Secret{}, fmt.Errorf("%w: file %s is empty", ErrSecret, ref.File)
		}
		return NewSecret(v), nil
	default:
		return Secret{}, nil
	}
}

// Secret holds a secret value. Every way of printing or encoding it (fmt
// verbs, slog, encoding/json, encoding.TextMarshaler) yields "[redacted]";
// only [Secret.Reveal] returns the value. The zero value is the empty
// secret. A Secret is immutable and safe to copy and share.
type Secret struct {
	// A pointer, so that reflection-based dumpers (%#v on a containing
	// struct uses GoString; spew-like tools would show an address) do not
	// print the bytes inline.
	v *string
}

// NewSecret wraps v.
func NewSecret(v string) Secret { return Secret{v: &v} }

// Reveal returns the secret value. Call it only where the value is handed
// to the library that needs it, never to format a message.
func (s Secret) Reveal() string {
	if s.v == nil {
		return ""
	}
	return *s.v
}

// IsZero reports whether s holds nothing.
func (s Secret) IsZero() bool { return s.v == nil || *s.v == "" }

func (s Secret) String() string   { return redacted }
func (s Secret) GoString() string { return `resources.Secret{` + redacted + `}` }

// Format redacts for every verb, including %x and %q, which would otherwise
// bypass String.
func (s Secret) Format(f fmt.State, verb rune) {
	if verb == 'v' && f.Flag('#') {
		_, _ = f.Write([]byte(s.GoString()))
		return
	}
	_, _ = f.Write([]byte(redacted))
}

// LogValue implements slog.LogValuer.
func (s Secret) LogValue() slog.Value { return slog.StringValue(redacted) }

// MarshalJSON implements json.Marshaler.
func (s Secret) MarshalJSON() ([]byte, error) { return []byte(`"` + redacted + `"`), nil }

// MarshalText implements encoding.TextMarshaler.
func (s Secret) MarshalText() ([]byte, error) { return []byte(redacted), nil }

// Files returns the files c's secrets are read from, sorted by kind; nil
// when none is a file.
func (c Credentials) Files() []string {
	var out []string
	for _, kind := range sortedKeys(c.Secrets) {
		if f := c.Secrets[kind].File; f != "" {
			out = append(out, f)
		}
	}
	return out
}

// ResolvedCredentials are a resource's [Credentials] with their secrets
// read. Secret returns the zero Secret for a kind the resource does not
// name.
type ResolvedCredentials struct {
	Username string
	secrets  map[string]Secret
}

// Secret returns the secret of kind, or the zero Secret when the resource
// names none.
func (c ResolvedCredentials) Secret(kind string) Secret { return c.secrets[kind] }

// Credentials resolves every secret c refers to, all or nothing. The error
// names each field that failed and its reference, never a value.
func (r Resolver) Credentials(c Credentials) (ResolvedCredentials, error) {
	out := ResolvedCredentials{Username: c.Username}
	var errs []error
	for _, kind := range sortedKeys(c.Secrets) {
		s, err := r.Resolve(c.Secrets[kind])
		if err != nil {
			errs = append(errs, fmt.Errorf("credentials.%s: %w", kind, err))
			continue
		}
		if out.secrets == nil {
			out.secrets = map[string]Secret{}
		}
		out.secrets[kind] = s
	}
	if len(errs) > 0 {
		return ResolvedCredentials{}, errors.Join(errs...)
	}
	return out, nil
}
