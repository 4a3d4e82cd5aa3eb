// Package address parses weida endpoint URLs:
//
//	weida://[sha256:<64 lowercase hex>@]host:port/path
//
// It has no I/O, so configuration loaders can validate URLs without pulling
// in the QUIC stack.
package address

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// MaxPathLen is the longest endpoint path weida carries (PROTOCOL §6.2 key 0).
const MaxPathLen = 512

// Address is one parsed weida endpoint.
type Address struct {
	// Fingerprint is the pinned "sha256:<hex>" of the peer's
	// SubjectPublicKeyInfo, or "" when the URL pins nothing.
	Fingerprint string
	Host        string // without brackets for IPv6
	Port        int
	Path        string // starts with '/'
}

// HostPort returns host:port, bracketing IPv6 hosts.
func (a Address) HostPort() string { return net.JoinHostPort(a.Host, strconv.Itoa(a.Port)) }

// String formats a as a weida URL that Parse reads back to a.
func (a Address) String() string {
	var b strings.Builder
	b.WriteString("weida://")
	if a.Fingerprint != "" {
		b.WriteString(a.Fingerprint)
		b.WriteByte('@')
	}
	b.WriteString(a.HostPort())
	b.WriteString(a.Path)
	return b.String()
}

// ErrSyntax is wrapped by every error Parse returns.
var ErrSyntax = errors.New("weida address: invalid URL")

func syntaxErr(raw, why string) error { return fmt.Errorf("%w %q: %s", ErrSyntax, raw, why) }

// Parse reads a weida URL. The port is required; the path is opaque, 1 to
// MaxPathLen bytes, starts with '/', and holds no byte below 0x20.
func Parse(raw string) (Address, error) {
	rest, ok := strings.CutPrefix(raw, "weida://")
	if !ok {
		return Address{}, syntaxErr(raw, `scheme must be "weida://"`)
	}
	var a Address
	if at := strings.IndexByte(rest, '@'); at >= 0 && at < indexOrLen(rest, '/') {
		fp := rest[:at]
		if err := ValidateFingerprint(fp); err != nil {
			return Address{}, syntaxErr(raw, err.Error())
		}
		a.Fingerprint = fp
		rest = rest[at+1:]
	}
	slash := strings.IndexByte(rest, '/')
	if slash < 0 {
		return Address{}, syntaxErr(raw, `a path starting with "/" is required`)
	}
	hostport, path := rest[:slash], rest[slash:]
	host, portStr, err := net.SplitHostPort(hostport)
	if err != nil {
		return Address{}, syntaxErr(raw, "host:port is required (IPv6 in brackets)")
	}
	if host == "" {
		return Address{}, syntaxErr(raw, "host is empty")
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 1 || port > 65535 {
		return Address{}, syntaxErr(raw, "port must be a number from 1 to 65535")
	}
	if err := ValidatePath(path); err != nil {
		return Address{}, syntaxErr(raw, err.Error())
	}
	a.Host, a.Port, a.Path = host, port, path
	return a, nil
}

func indexOrLen(s string, c byte) int {
	if i := strings.IndexByte(s, c); i >= 0 {
		return i
	}
	return len(s)
}

// ValidatePath checks an endpoint path against PROTOCOL's rules.
func ValidatePath(p string) error {
	switch {
	case p == "" || p[0] != '/':
		return errors.New(`path must start with "/"`)
	case len(p) > MaxPathLen:
		return fmt.Errorf("path is %d bytes, more than %d", len(p), MaxPathLen)
	}
	for i := 0; i < len(p); i++ {
		if p[i] < 0x20 {
			return fmt.Errorf("path holds control byte 0x%02x at %d", p[i], i)
		}
	}
	return nil
}

// ValidateFingerprint checks the text form "sha256:<64 lowercase hex>".
func ValidateFingerprint(fp string) error {
	hex, ok := strings.CutPrefix(fp, "sha256:")
	if !ok || len(hex) != 64 {
		return errors.New(`fingerprint must be "sha256:" and 64 lowercase hex digits`)
	}
	for i := 0; i < len(hex); i++ {
		c := hex[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return errors.New(`fingerprint must be "sha256:" and 64 lowercase hex digits`)
		}
	}
	return nil
}
