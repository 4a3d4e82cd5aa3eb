package resources

import (
	"errors"
	"fmt"

	"weida.dev/connector/weida/address"
	"weida.dev/connector/weida/topic"
)

// maxScopes bounds the scopes of one client: each SUBSCRIBE of the client
// is checked against all of them.
const maxScopes = 64

// allowedClients checks spec.weida.allowedClients (at path) and returns the
// fingerprints it admits, in order, and the scopes of the entries that
// have some (nil when none has). Every fault is recorded.
func (b *binder) allowedClients(path string, raw []rawClient) ([]string, map[string][]string) {
	var fps []string
	var scopes map[string][]string
	seen := make(map[string]int, len(raw))
	for i, rc := range raw {
		entry := fmt.Sprintf("%s[%d]", path, i)
		if !b.ok(entry) {
			continue // the decoder said what is wrong with it
		}
		fpath := entry
		if !rc.bare {
			fpath = entry + ".client"
		}
		switch {
		case !rc.bare && rc.Client == "":
			b.fail(fpath, b.lookupPos(fpath, true), "", "required",
				"is required: an entry with scopes names its client",
				"client: sha256:<64 hex digits> (`connector weida` prints a certificate's fingerprint)")
			continue
		case address.ValidateFingerprint(rc.Client) != nil:
			b.fail(fpath, b.at(fpath), rc.Client, "fingerprint",
				`must be "sha256:" followed by 64 lowercase hexadecimal digits`,
				"`connector weida` prints a certificate's fingerprint")
			continue
		}
		if j, dup := seen[rc.Client]; dup {
			b.fail(path, b.at(entry), rc.Client, "unique",
				fmt.Sprintf("lists %s twice, in entries %d and %d", rc.Client, j, i),
				"list each client once; give it all its scopes in one entry")
			continue
		}
		seen[rc.Client] = i
		fps = append(fps, rc.Client)
		if rc.bare || rc.Scopes == nil {
			continue // admitted to everything
		}
		if s, ok := b.clientScopes(entry+".scopes", rc.Scopes); ok {
			if scopes == nil {
				scopes = make(map[string][]string)
			}
			scopes[rc.Client] = s
		}
	}
	return fps, scopes
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
