package resources

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Position is a place in a resource file. Line and Column count from 1; a
// zero Line means the whole file (for example when it cannot be read).
type Position struct {
	File   string `json:"file"`
	Line   int    `json:"line,omitempty"`
	Column int    `json:"column,omitempty"`
}

// String formats p as "file:line:column", leaving out what is zero.
func (p Position) String() string {
	switch {
	case p.Line == 0:
		return p.File
	case p.Column == 0:
		return fmt.Sprintf("%s:%d", p.File, p.Line)
	default:
		return fmt.Sprintf("%s:%d:%d", p.File, p.Line, p.Column)
	}
}

// compare orders positions by file, line and column.
func (p Position) compare(q Position) int {
	if c := strings.Compare(p.File, q.File); c != 0 {
		return c
	}
	if p.Line != q.Line {
		return p.Line - q.Line
	}
	return p.Column - q.Column
}

// FieldError is one thing wrong with a resource. The loader reports every
// FieldError it finds, joined with [errors.Join]; [Errors] takes them apart.
//
// Value never holds a secret: where the offending value is (or may be) a
// secret, Value is "[redacted]".
type FieldError struct {
	Position
	// Resource is the resource's metadata.name, or "" when the document
	// has none (or the file could not be parsed at all).
	Resource string `json:"resource,omitempty"`
	// Field is the YAML path of the offending field, e.g.
	// "spec.routes[2].filter"; "" for errors about a whole file.
	Field string `json:"field,omitempty"`
	// Value is the offending value as written (possibly shortened), or ""
	// when the field is missing.
	Value string `json:"value,omitempty"`
	// Rule is a stable code naming the rule that was broken, e.g.
	// "required", "unknown-field", "nats-one-or-more". Tests and tools may
	// match on it; the wording of Message and Hint may change.
	Rule string `json:"rule"`
	// Message says what is wrong, in one sentence for an operator.
	Message string `json:"message"`
	// Hint says what to write instead; may be empty.
	Hint string `json:"hint,omitempty"`
	// Err is the underlying cause, if any: a *policy.Refusal for a refused
	// route, an address syntax error for a weida URL.
	Err error `json:"-"`
}

// Error formats e on one line:
//
//	file:line:col: resource "name": spec.routes[0].filter "a.>": message [rule]; hint: ...
func (e *FieldError) Error() string {
	var b strings.Builder
	b.WriteString(e.Position.String())
	b.WriteString(": ")
	if e.Resource != "" {
		fmt.Fprintf(&b, "resource %q: ", e.Resource)
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		if e.Value != "" {
			fmt.Fprintf(&b, " %q", e.Value)
		}
		b.WriteString(": ")
	}
	b.WriteString(e.Message)
	fmt.Fprintf(&b, " [%s]", e.Rule)
	if e.Hint != "" {
		b.WriteString("; hint: ")
		b.WriteString(e.Hint)
	}
	return b.String()
}

// Unwrap returns the cause, so errors.As finds a *policy.Refusal.
func (e *FieldError) Unwrap() error { return e.Err }

// Errors returns every *FieldError in err, which may be a single
// *FieldError or any tree of joined or wrapped errors, in the order the
// tree holds them. It returns nil for a nil err.
func Errors(err error) []*FieldError {
	var out []*FieldError
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) {
		case nil:
		case *FieldError:
			out = append(out, e)
		case interface{ Unwrap() []error }:
			for _, x := range e.Unwrap() {
				walk(x)
			}
		default:
			if fe := (*FieldError)(nil); errors.As(err, &fe) {
				out = append(out, fe)
			}
		}
	}
	walk(err)
	return out
}

func sortErrors(errs []*FieldError) {
	slices.SortStableFunc(errs, func(a, b *FieldError) int { return a.Position.compare(b.Position) })
}

func joinErrors(errs []*FieldError) error {
	if len(errs) == 0 {
		return nil
	}
	all := make([]error, len(errs))
	for i, e := range errs {
		all[i] = e
	}
	return errors.Join(all...)
}

// redacted replaces values that may be secrets wherever they would be shown.
const redacted = "[redacted]"

// maxValueLen bounds the Value shown in an error, so a pasted certificate
// or a huge scalar does not flood the terminal.
const maxValueLen = 120

func shorten(s string) string {
	if len(s) <= maxValueLen {
		return s
	}
	cut := maxValueLen
	for cut > 0 && s[cut]&0xC0 == 0x80 { // do not split a UTF-8 sequence
		cut--
	}
	return s[:cut] + "…"
}
