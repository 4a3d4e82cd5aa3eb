package resources

import (
	"errors"
	"fmt"
	"strings"

	"weida.dev/connector/weida/address"
	"weida.dev/connector/weida/topic"
)

// maxScopes bounds the scopes of one client: each SUBSCRIBE of the client
// is checked against all of them.
const maxScopes = 64

// allowedClients checks spec.weida.allowedClients (at path) and returns
// the names it admits, in order: fingerprints ("sha256:<hex>") and
// CA-issued identities ("dns:…", "uri:…", "email:…" from san, "cn:…" from
// commonName), and the scopes of the entries that have some (nil when
// none has). Every fault is recorded.
func (b *binder) allowedClients(path string, raw []rawClient) ([]string, map[string][]string) {
	var names []string
	var scopes map[string][]string
	seen := make(map[string]int, len(raw))
	for i, rc := range raw {
		entry := fmt.Sprintf("%s[%d]", path, i)
		if !b.ok(entry) {
			continue // the decoder said what is wrong with it
		}
		name, ok := b.clientName(entry, rc)
		if !ok {
			continue
		}
		if j, dup := seen[name]; dup {
			b.fail(path, b.at(entry), name, "unique",
				fmt.Sprintf("lists %s twice, in entries %d and %d", name, j, i),
				"list each client once; give it all its scopes in one entry")
			continue
		}
		seen[name] = i
		names = append(names, name)
		if rc.bare || rc.Scopes == nil {
			continue // admitted to everything
		}
		if s, ok := b.clientScopes(entry+".scopes", rc.Scopes); ok {
			if scopes == nil {
				scopes = make(map[string][]string)
			}
			scopes[name] = s
		}
	}
	return names, scopes
}

// fingerprint refuses, at path, a client fingerprint that is not one.
func (b *binder) fingerprint(path, fp string) bool {
	if address.ValidateFingerprint(fp) != nil {
		b.fail(path, b.at(path), fp, "fingerprint",
			`must be "sha256:" followed by 64 lowercase hexadecimal digits`,
			"`connector weida` prints a certificate's fingerprint")
		return false
	}
	return true
}

// clientName checks how one allowedClients entry names its client and
// returns the name weida admits it under.
func (b *binder) clientName(entry string, rc rawClient) (string, bool) {
	if rc.bare {
		return rc.Client, b.fingerprint(entry, rc.Client)
	}
	var set []string
	for _, f := range []struct{ key, value string }{{"client", rc.Client}, {"san", rc.SAN}, {"commonName", rc.CommonName}} {
		if f.value != "" {
			set = append(set, f.key)
		}
	}
	switch len(set) {
	case 0:
		b.fail(entry+".client", b.lookupPos(entry+".client", true), "", "required",
			"is required: an entry names its client by client (a fingerprint), san or commonName",
			"client: sha256:<64 hex digits> (`connector weida` prints a certificate's fingerprint), or san: dns:<name> for a certificate clientCAFile issued")
		return "", false
	case 1:
	default:
		b.fail(entry, b.lookupPos(entry, true), strings.Join(set, ", "), "client-one-name",
			"names its client "+strings.Join(set, " and ")+": one entry names one client, one way",
			"keep one of them; a client known both ways may have two entries, whose scopes add up")
		return "", false
	}
	switch {
	case rc.Client != "":
		return rc.Client, b.fingerprint(entry+".client", rc.Client)
	case rc.SAN != "":
		fpath := entry + ".san"
		kind, _, _ := strings.Cut(rc.SAN, ":")
		if err := address.ValidateIdentity(rc.SAN); err != nil || kind == "cn" {
			msg := `must be "dns:", "uri:" or "email:" and the name, exactly as the certificate carries it`
			if err != nil && kind != "cn" {
				msg = "is not a subject alternative name: " + err.Error()
			}
			b.fail(fpath, b.at(fpath), rc.SAN, "client-san", msg,
				"san: dns:dash-7.plant-a.example, san: uri:spiffe://plant-a/dash or san: email:ops@plant-a.example; a subject's CommonName goes in commonName")
			return "", false
		}
		return rc.SAN, true
	default:
		fpath := entry + ".commonName"
		name := "cn:" + rc.CommonName
		if err := address.ValidateIdentity(name); err != nil {
			b.fail(fpath, b.at(fpath), rc.CommonName, "client-common-name",
				"is not a CommonName weida can match: "+err.Error(),
				"write the CommonName alone, exactly as the certificate carries it: commonName: dash-7, not CN=dash-7,O=plant-a")
			return "", false
		}
		if strings.HasPrefix(strings.ToUpper(rc.CommonName), "CN=") {
			b.fail(fpath, b.at(fpath), rc.CommonName, "client-common-name",
				"is a distinguished name; only the CommonName is compared",
				"write the CommonName alone: commonName: "+strings.TrimPrefix(strings.SplitN(rc.CommonName[3:], ",", 2)[0], " "))
			return "", false
		}
		return name, true
	}
}

// clientScopes checks one client's scopes, each a weida filter.
func (b *binder) clientScopes(path string, scopes []string) ([]string, bool) {
	switch {
	case len(scopes) == 0:
		b.fail(path, b.lookupPos(path, true), "[]", "min",
			"is empty: the client could subscribe to nothing",
			"leave scopes out (or list the bare fingerprint) to admit the client to everything, or remove the client")
		return nil, false
	case len(scopes) > maxScopes:
		b.fail(path, b.lookupPos(path, true), fmt.Sprint(len(scopes)), "max",
			fmt.Sprintf("lists %d scopes, more than %d", len(scopes), maxScopes),
			"a wider filter (one ending in .#) covers many narrow ones")
		return nil, false
	}
	ok := true
	seen := make(map[string]int, len(scopes))
	for j, f := range scopes {
		spath := fmt.Sprintf("%s[%d]", path, j)
		if err := topic.ValidateFilter(f); err != nil {
			var fe *topic.FilterError
			rule, hint := "weida-filter", ""
			if errors.As(err, &fe) {
				rule, hint = string(fe.Rule), scopeHint(fe.Rule)
			}
			b.fail(spath, b.at(spath), f, rule, "is not a weida filter: "+err.Error(), hint, err)
			ok = false
			continue
		}
		if k, dup := seen[f]; dup {
			b.fail(spath, b.at(spath), f, "unique", fmt.Sprintf("repeats scope %d", k), "remove one of the two")
			ok = false
			continue
		}
		seen[f] = j
	}
	return scopes, ok
}

// scopeHint says how to write a scope that broke rule.
func scopeHint(rule topic.Rule) string {
	switch rule {
	case topic.RuleStarNotAlone:
		return "'*' stands for one whole segment: write plant.*.temp, not plant.a*"
	case topic.RuleHashNotAlone, topic.RuleHashNotFinal:
		return "'#' stands for the remaining segments and ends a scope: write plant.a.#"
	case topic.RuleTooLong:
		return fmt.Sprintf("a weida filter has at most %d bytes", topic.MaxLen)
	case topic.RuleInvalidUTF8:
		return "write the scope as UTF-8 text"
	}
	return ""
}
