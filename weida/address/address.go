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

// CanonicalHostPort returns host:port with the host in [CanonicalHost]
// form, so that two addresses of one socket compare equal.
func (a Address) CanonicalHostPort() string {
	return net.JoinHostPort(CanonicalHost(a.Host), strconv.Itoa(a.Port))
}

// CanonicalHost makes equal hosts compare equal: an IP address in its
// standard form ([::1] and [0:0::1] are one host), a name in lower case
// (DNS names are case-insensitive). Names are not resolved: two names of
// one host stay two hosts.
func CanonicalHost(h string) string {
	if ip := net.ParseIP(h); ip != nil {
		return ip.String()
	}
	return strings.ToLower(h)
}

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

// ReplicaError says why an address cannot stand beside the first of a list
// of addresses of one endpoint (see [CheckReplicas]).
type ReplicaError struct {
	Index int    // the address's position in the list, from 0
	Value string // the address as written
	// Rule is "replica-path" (its path differs from the first's),
	// "replica-pin" (it pins another fingerprint, or pins where the first
	// does not, or the other way round) or "replica-duplicate" (it repeats
	// an earlier address).
	Rule string
	Msg  string // what is wrong, in words
}

func (e *ReplicaError) Error() string {
	return fmt.Sprintf("weida address: %q (address %d): %s", e.Value, e.Index+1, e.Msg)
}

// CheckReplicas checks that addrs, parsed from raws, can be the addresses
// of one endpoint: the replicas of a publisher path present one identity on
// one path, so every address names the same path and pins the same
// fingerprint (or none) as the first, and no host:port repeats (compared
// in [Address.CanonicalHostPort] form). A dialer
// can then move between them and keep the same path, filters and pin. It
// returns a [*ReplicaError] for each address that cannot, nil when all can.
func CheckReplicas(addrs []Address, raws []string) []*ReplicaError {
	var errs []*ReplicaError
	if len(addrs) == 0 {
		return nil
	}
	first := addrs[0]
	seen := map[string]int{first.CanonicalHostPort(): 0}
	for i, a := range addrs[1:] {
		i++
		e := &ReplicaError{Index: i, Value: raws[i]}
		switch {
		case a.Path != first.Path:
			e.Rule, e.Msg = "replica-path", fmt.Sprintf("names the path %q, but the first address names %q: replicas of one endpoint serve one path", a.Path, first.Path)
		case a.Fingerprint != first.Fingerprint && first.Fingerprint == "":
			e.Rule, e.Msg = "replica-pin", "pins a fingerprint, but the first address pins none: replicas of one endpoint present one identity"
		case a.Fingerprint != first.Fingerprint && a.Fingerprint == "":
			e.Rule, e.Msg = "replica-pin", fmt.Sprintf("pins no fingerprint, but the first address pins %s: replicas of one endpoint present one identity", first.Fingerprint)
		case a.Fingerprint != first.Fingerprint:
			e.Rule, e.Msg = "replica-pin", fmt.Sprintf("pins %s, but the first address pins %s: replicas of one endpoint present one identity", a.Fingerprint, first.Fingerprint)
		default:
			if j, dup := seen[a.CanonicalHostPort()]; dup {
				e.Rule, e.Msg = "replica-duplicate", fmt.Sprintf("repeats address %d, %s", j+1, addrs[j].HostPort())
			} else {
				seen[a.CanonicalHostPort()] = i
				continue
			}
		}
		errs = append(errs, e)
	}
	return errs
}

// MaxIdentityLen bounds a client identity (see [ValidateIdentity]): a
// DNS name is at most 253 bytes, and a longer name is a mistake, not a
// certificate anyone issues.
const MaxIdentityLen = 1024

// ValidateIdentity checks the text form of a CA-issued client identity:
// one of "dns:<name>", "uri:<uri>", "email:<address>" (a subject
// alternative name of that type) or "cn:<common name>" (the subject's
// CommonName), with a value that is not empty, holds no byte below 0x20
// and no space at either end, since a certificate's value is compared
// byte for byte and such a value would never match.
func ValidateIdentity(id string) error {
	kind, value, ok := strings.Cut(id, ":")
	switch {
	case !ok || (kind != "dns" && kind != "uri" && kind != "email" && kind != "cn"):
		return errors.New(`identity must start with "dns:", "uri:", "email:" or "cn:"`)
	case value == "":
		return fmt.Errorf("identity %q names no %s value", id, kind)
	case len(id) > MaxIdentityLen:
		return fmt.Errorf("identity is %d bytes, more than %d", len(id), MaxIdentityLen)
	case strings.TrimSpace(value) != value:
		return fmt.Errorf("identity %q has a space at an end; certificates are compared byte for byte", id)
	}
	for i := 0; i < len(value); i++ {
		if value[i] < 0x20 || value[i] == 0x7f {
			return fmt.Errorf("identity %q holds control byte 0x%02x", id, value[i])
		}
	}
	return nil
}
