package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"weida.dev/connector/policy"
	"weida.dev/connector/resources"
	"weida.dev/connector/service"
)

// cmdCheck loads resource files exactly as `run` does and reports, per
// resource, its conversion or its errors. It reads no secret and opens no
// network connection: everything it needs is in the files.
func cmdCheck(_ context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := newFlagSet("check", "connector check -f PATH [-f PATH...] [--output text|json]", stderr)
	var paths stringList
	fs.Var(&paths, "f", "a resource file, or a directory whose *.yaml and *.yml files are read (not recursively); repeatable")
	output := fs.String("output", "text", "output format: text or json")
	if code, done := parseFlags(fs, args, stdout); done {
		return code
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "connector check: unexpected argument %q; name resource files with -f\n", fs.Arg(0))
		return exitUsage
	case len(paths) == 0:
		fmt.Fprintln(stderr, "connector check: no resources named; use -f FILE or -f DIRECTORY")
		return exitUsage
	case *output != "text" && *output != "json":
		fmt.Fprintf(stderr, "connector check: --output must be text or json, not %q\n", *output)
		return exitUsage
	}

	set, err := resources.Load(service.Protocols(programDrivers()), paths...)
	if *output == "json" {
		if werr := writeCheckJSON(stdout, set); werr != nil {
			fmt.Fprintf(stderr, "connector check: %v\n", werr)
			return exitFailure
		}
	} else {
		writeCheckText(stdout, set)
	}
	if err != nil {
		return exitFailure
	}
	return exitOK
}

// writeCheckText prints one block per document: a header line that says
// valid or INVALID, then either the conversion or the errors, each error
// with its position first so that editors and terminals can jump to it.
func writeCheckText(w io.Writer, set *resources.Set) {
	valid, invalid, nerr, paths := 0, 0, 0, 0
	for i, d := range set.Documents {
		if i > 0 {
			fmt.Fprintln(w)
		}
		name := d.Name
		if name == "" {
			name = "(unnamed)"
		}
		switch {
		case d.Source.Line == 0: // a path that yielded no resource
			paths++
			fmt.Fprintf(w, "%s  INVALID\n", d.Source)
		case d.Connector != nil:
			valid++
			fmt.Fprintf(w, "%s  %s  valid\n", d.Source, name)
			writeConnector(w, d.Connector)
		default:
			invalid++
			nerr += len(d.Errors)
			fmt.Fprintf(w, "%s  %s  INVALID: %s\n", d.Source, name, plural(len(d.Errors), "error"))
		}
		for _, e := range d.Errors {
			writeDiagnostic(w, "error", e)
		}
		for _, e := range d.Warnings {
			writeDiagnostic(w, "warning", e)
		}
	}
	if len(set.Documents) > 0 {
		fmt.Fprintln(w)
	}
	summary := fmt.Sprintf("%s checked: %d valid", plural(valid+invalid, "resource"), valid)
	if invalid > 0 {
		summary += fmt.Sprintf(", %d invalid (%s)", invalid, plural(nerr, "error"))
	}
	if paths > 0 {
		summary += fmt.Sprintf("; %s without resources", plural(paths, "path"))
	}
	fmt.Fprintln(w, summary)
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}

func writeDiagnostic(w io.Writer, kind string, e *resources.FieldError) {
	where := e.Position.String()
	if e.Field != "" {
		where += "  " + e.Field
	}
	if e.Value != "" {
		where += fmt.Sprintf(" = %q", e.Value)
	}
	fmt.Fprintf(w, "  %-7s %s\n", kind, where)
	fmt.Fprintf(w, "          %s [%s]\n", e.Message, e.Rule)
	if e.Hint != "" {
		fmt.Fprintf(w, "          hint: %s\n", e.Hint)
	}
}

func writeConnector(w io.Writer, c *resources.Connector) {
	fmt.Fprintf(w, "  %-7s %s %s, policy %s\n", "bridge", c.Protocol, c.Direction, c.Policy.Name())
	if c.Mount != (policy.Mount{}) {
		// Quoted: an empty prefix (none) must show.
		fmt.Fprintf(w, "  %-7s %s %q  ↔  weida %q\n", "mount", c.Protocol, c.Mount.Foreign, c.Mount.Weida)
	}
	fmt.Fprintf(w, "  %-7s %s  %s\n", "broker", c.Broker.URL, brokerSummary(c))
	for i, line := range weidaSummary(c) {
		label := ""
		if i == 0 {
			label = "weida"
		}
		fmt.Fprintf(w, "  %-7s %s\n", label, line)
	}
	nameW, foreignW := 0, 0
	for _, r := range c.Routes {
		nameW, foreignW = max(nameW, len(r.Name)), max(foreignW, len(r.Foreign))
	}
	for i, r := range c.Routes {
		label := ""
		if i == 0 {
			label = "routes"
		}
		name := r.Name
		if name == r.Foreign {
			name = ""
		}
		fmt.Fprintf(w, "  %-7s %-*s  %-*s  →  %s\n", label, nameW, name, foreignW, r.Foreign, r.Weida)
	}
	losses := "none"
	if len(c.Losses) > 0 {
		s := make([]string, len(c.Losses))
		for i, l := range c.Losses {
			s[i] = string(l)
		}
		losses = strings.Join(s, ", ")
	}
	fmt.Fprintf(w, "  %-7s %s\n", "losses", losses)
}

// brokerSummary says who the connector is on the broker and how it reads
// or writes there. It names where secrets come from, never their values.
func brokerSummary(c *resources.Connector) string {
	b := c.Broker
	parts := []string{"client id " + b.ClientID}
	cr := b.Credentials
	d := service.Lookup(programDrivers(), string(c.Protocol))
	switch pw := cr.Secret("password"); {
	case cr.Username != "" && !pw.IsZero():
		parts = append(parts, fmt.Sprintf("user %s (password from %s)", cr.Username, pw))
	case cr.Username != "":
		parts = append(parts, "user "+cr.Username)
	case d != nil:
		// The first other secret the protocol declares, by its label.
		for _, k := range d.Credentials() {
			if ref := cr.Secret(k.Name); k.Name != "password" && !ref.IsZero() {
				parts = append(parts, fmt.Sprintf("%s from %s", k.Label, ref))
				break
			}
		}
	}
	if d != nil {
		if s := d.Summary(c); s != "" {
			parts = append(parts, s)
		}
	}
	return strings.Join(parts, "; ")
}

func weidaSummary(c *resources.Connector) []string {
	wd := c.Weida
	if c.Direction == policy.Inbound {
		cert := "certificate generated once and kept in run's state directory (its fingerprint is in /status and the log)"
		if !wd.Generated() {
			cert = "certificate " + wd.CertFile
		}
		who := fmt.Sprintf("OPEN: anyone who can reach %s may subscribe", wd.Endpoint.HostPort())
		var ids []string
		if !wd.Open() {
			fps := 0
			for _, n := range wd.AllowedClients {
				if strings.HasPrefix(n, "sha256:") {
					fps++
				} else {
					ids = append(ids, n)
				}
			}
			var parts []string
			if fps > 0 {
				parts = append(parts, plural(fps, "client fingerprint"))
			}
			if len(ids) > 0 {
				word := "CA-issued identities"
				if len(ids) == 1 {
					word = "CA-issued identity"
				}
				parts = append(parts, fmt.Sprintf("%d %s", len(ids), word))
			}
			who = "only " + strings.Join(parts, " and ") + " may subscribe"
			if n := len(wd.Scopes); n > 0 {
				who += fmt.Sprintf(", %d of them within their scopes only", n)
			}
		}
		lines := []string{"hosts " + wd.Endpoint.String(), cert + "; " + who}
		if len(ids) > 0 {
			// The names, so that an operator sees what the CA must have issued.
			lines = append(lines, "client CA "+wd.ClientCAFile+" proves "+strings.Join(ids, ", "))
		}
		if lv := c.LastValue; lv.Mode != "" {
			lines = append(lines, fmt.Sprintf("replays the last value of each topic to new subscriptions (%s messages; at most %d topics, %d bytes)",
				lv.Mode, lv.MaxTopics, lv.MaxBytes))
			down := "replays marked stale while the broker is disconnected"
			if lv.WhenSourceDown == "withhold" {
				down = "replays nothing while the broker is disconnected"
			}
			if lv.MaxAge > 0 {
				down = fmt.Sprintf("values end %s after the broker delivered them; ", lv.MaxAge) + down
			}
			if lv.OrphanAfter > 0 {
				down += fmt.Sprintf(", purged after %s disconnected", lv.OrphanAfter)
			}
			lines = append(lines, down)
			if lv.Persist {
				lines = append(lines, "keeps the last values in the state directory across restarts (lastvalue/"+c.Name+".cbor)")
			}
		}
		return lines
	}
	trust := "trusts the pinned fingerprint"
	if wd.Endpoint.Fingerprint == "" {
		trust = "trusts the CA file " + wd.CAFile
	}
	if wd.CertFile != "" {
		trust += "; client certificate " + wd.CertFile
	}
	lines := []string{"dials " + wd.Endpoint.String()}
	if urls := wd.DialURLs()[1:]; len(urls) > 0 {
		lines = append(lines, "fails over to "+strings.Join(urls, ", ")+", in turn")
	}
	return append(lines, trust)
}

// checkJSON is the --output json document.
type checkJSON struct {
	Valid     bool           `json:"valid"`
	Resources []resourceJSON `json:"resources"`
	// Paths are the errors of paths that yielded no resource (unreadable,
	// empty, a directory without resource files).
	Paths   []*resources.FieldError `json:"paths,omitempty"`
	Summary summaryJSON             `json:"summary"`
}

type summaryJSON struct {
	Resources int `json:"resources"`
	Valid     int `json:"valid"`
	Invalid   int `json:"invalid"`
	Errors    int `json:"errors"`
	Paths     int `json:"paths"` // paths that yielded no resource
}

type resourceJSON struct {
	Name      string                  `json:"name"`
	Source    resources.Position      `json:"source"`
	Valid     bool                    `json:"valid"`
	Protocol  string                  `json:"protocol,omitempty"`
	Direction string                  `json:"direction,omitempty"`
	Policy    string                  `json:"policy,omitempty"`
	Mount     *mountJSON              `json:"mount,omitempty"`
	Broker    string                  `json:"broker,omitempty"`
	Weida     *weidaJSON              `json:"weida,omitempty"`
	Routes    []routeJSON             `json:"routes,omitempty"`
	Losses    []policy.Loss           `json:"losses,omitempty"`
	Errors    []*resources.FieldError `json:"errors,omitempty"`
	Warnings  []*resources.FieldError `json:"warnings,omitempty"`
}

type weidaJSON struct {
	Role           string   `json:"role"` // "listen" or "dial"
	Endpoint       string   `json:"endpoint"`
	Open           bool     `json:"open,omitempty"`
	Certificate    string   `json:"certificate,omitempty"` // a file, or "generated"
	AllowedClients []string `json:"allowedClients,omitempty"`
	// ClientCAFile issues the allowed clients named by identity.
	ClientCAFile string `json:"clientCAFile,omitempty"`
	// Scopes are the filters some allowed clients are limited to, by
	// fingerprint or identity.
	Scopes map[string][]string `json:"scopes,omitempty"`
	CAFile string              `json:"caFile,omitempty"`
	// Failover are the dialled endpoint's further addresses, in order.
	Failover []string `json:"failover,omitempty"`
}

// mountJSON is spec.conversion.mount; absent when the resource has none.
type mountJSON struct {
	Foreign string `json:"foreign"`
	Weida   string `json:"weida"`
}

type routeJSON struct {
	Name    string `json:"name"`
	Foreign string `json:"foreign"`
	Weida   string `json:"weida"`
}

func writeCheckJSON(w io.Writer, set *resources.Set) error {
	out := checkJSON{Valid: true, Resources: []resourceJSON{}}
	for _, d := range set.Documents {
		if d.Source.Line == 0 { // a path that yielded no resource
			out.Valid = false
			out.Paths = append(out.Paths, d.Errors...)
			out.Summary.Paths++
			continue
		}
		r := resourceJSON{Name: d.Name, Source: d.Source, Valid: d.Connector != nil, Errors: d.Errors, Warnings: d.Warnings}
		if c := d.Connector; c != nil {
			out.Summary.Valid++
			r.Protocol, r.Direction, r.Policy, r.Broker = string(c.Protocol), string(c.Direction), c.Policy.Name(), c.Broker.URL
			r.Losses = c.Losses
			if c.Mount != (policy.Mount{}) {
				r.Mount = &mountJSON{c.Mount.Foreign, c.Mount.Weida}
			}
			for _, rt := range c.Routes {
				r.Routes = append(r.Routes, routeJSON{rt.Name, rt.Foreign, rt.Weida})
			}
			r.Weida = weidaOf(c)
		} else {
			out.Valid = false
			out.Summary.Invalid++
			out.Summary.Errors += len(d.Errors)
		}
		out.Resources = append(out.Resources, r)
	}
	out.Summary.Resources = len(out.Resources)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func weidaOf(c *resources.Connector) *weidaJSON {
	wd := c.Weida
	if c.Direction == policy.Inbound {
		cert := wd.CertFile
		if wd.Generated() {
			cert = "generated"
		}
		return &weidaJSON{Role: "listen", Endpoint: wd.Endpoint.String(), Open: wd.Open(), Certificate: cert, AllowedClients: wd.AllowedClients, ClientCAFile: wd.ClientCAFile, Scopes: wd.Scopes}
	}
	j := &weidaJSON{Role: "dial", Endpoint: wd.Endpoint.String(), Certificate: wd.CertFile, CAFile: wd.CAFile}
	if urls := wd.DialURLs()[1:]; len(urls) > 0 {
		j.Failover = urls
	}
	return j
}
