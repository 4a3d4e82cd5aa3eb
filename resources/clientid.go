package resources

import (
	"fmt"
	"os"
	"regexp"
	"strings"
)

// clientIDVar is one ${NAME} reference in spec.broker.clientID: replicas
// that share a file can then each have their own broker identity, which an
// MQTT broker needs to keep their sessions apart (clientID: orders-${HOSTNAME}).
var clientIDVar = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// clientIDTemplateProblem says what is wrong with the ${...} references of
// a client ID, or "" when each "${" starts a well-formed one.
func clientIDTemplateProblem(id string) string {
	rest := clientIDVar.ReplaceAllString(id, "")
	if strings.Contains(rest, "${") {
		return "has a ${ that does not start a reference of the form ${NAME} (letters, digits and '_', not starting with a digit)"
	}
	return ""
}

// ClientID returns the client ID with each ${NAME} replaced by that
// environment variable. An unset or empty variable is an error: two
// replicas would otherwise share one identity without anyone noticing.
func (r Resolver) ClientID(id string) (string, error) {
	lookup := r.LookupEnv
	if lookup == nil {
		lookup = os.LookupEnv
	}
	var missing []string
	out := clientIDVar.ReplaceAllStringFunc(id, func(ref string) string {
		name := ref[2 : len(ref)-1]
		v, ok := lookup(name)
		if !ok || v == "" {
			missing = append(missing, name)
		}
		return v
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("broker.clientID %q: environment variable %s is not set or empty", id, strings.Join(missing, ", "))
	}
	if !IsPrintable(out) || len(out) > 256 {
		return "", fmt.Errorf("broker.clientID %q expands to %q, which is not printable UTF-8 text of at most 256 bytes", id, out)
	}
	return out, nil
}
