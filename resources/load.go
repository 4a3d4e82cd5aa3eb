package resources

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/go-playground/validator/v10"
	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/lexer"
	"github.com/goccy/go-yaml/parser"
	"github.com/goccy/go-yaml/token"

	"weida.dev/connector/internal/safefile"
	"weida.dev/connector/policy"
)

// MaxFileBytes is the largest resource file the loader reads.
const MaxFileBytes = 4 << 20

// maxDocuments bounds the documents read from one file.
const maxDocuments = 1000

// Loader reads Connector resources from files and directories. A Loader
// holds no state between calls; it is safe for concurrent use when its FS
// and Protocols are.
type Loader struct {
	// Protocols are the broker protocols resources may use, in the order
	// messages list them: spec.protocol must name one, and each reads its
	// own spec.broker block. With none, every resource is refused.
	Protocols []Protocol
	// FS is where paths are read. nil means the operating system's files,
	// with paths as given on the command line (relative to the working
	// directory, or absolute). With a non-nil FS, paths follow io/fs
	// rules (slash-separated, unrooted), as in fstest.MapFS.
	FS fs.FS
}

// Load reads every resource in paths, each a file or a directory. A
// directory contributes its *.yaml and *.yml files, sorted by name, and
// nothing from its subdirectories: loading is not recursive, and files
// whose names start with '.' are skipped. A file may hold several
// resources separated by "---". A path named twice is read once.
//
// Load always returns a non-nil Set listing every document it found, valid
// or not. The error is nil when every resource is valid; otherwise it is
// [errors.Join] of every [*FieldError] of every file, in file order, and no
// resource should be run. Load reads no secret and opens no connection.
//
// Relative paths written inside a resource (certificates, secret files)
// are resolved against the directory of the file that holds the resource.
func (l Loader) Load(paths ...string) (*Set, error) {
	set := &Set{}
	ps := protocolList(l.Protocols)
	ld := &load{Loader: l, set: set, seen: map[string]bool{}, v: newValidator(ps), protocols: ps, creds: ps.credentialsType()}
	for _, p := range paths {
		ld.path(p)
	}
	crossCheck(set, ps)
	for _, d := range set.Documents {
		d.finish()
	}
	return set, set.Err()
}

// Load reads resources of the given protocols from the operating system's
// files; see [Loader.Load].
func Load(protocols []Protocol, paths ...string) (*Set, error) {
	return Loader{Protocols: protocols}.Load(paths...)
}

// Set is the result of one [Loader.Load].
type Set struct {
	// Documents lists every resource document, and every path that could
	// not be read, in the order read.
	Documents []*Document
}

// Document is one resource document as loaded.
type Document struct {
	// Source is where the document starts (Line 0 for a path that could
	// not be read at all).
	Source Position
	// Name is metadata.name as written; "" when missing.
	Name string
	// Connector is the bound resource; nil exactly when Errors is not
	// empty.
	Connector *Connector
	// Errors are sorted by position.
	Errors []*FieldError
	// Warnings do not stop the resource from running: they point out a
	// risk, such as an endpoint open to anyone on a non-loopback address.
	Warnings []*FieldError

	partial *Connector // what binding could fill in, for cross-resource checks
	dec     *decoder   // positions of the fields, for cross-resource errors
}

func (d *Document) pos(path string) Position { return d.dec.lookupPos(path, false) }

func (d *Document) hasField(path string) bool { _, ok := d.dec.pos[path]; return ok }

func (d *Document) finish() {
	sortErrors(d.Errors)
	sortErrors(d.Warnings)
	for _, e := range slices.Concat(d.Errors, d.Warnings) {
		if e.Resource == "" {
			e.Resource = d.Name
		}
	}
	if len(d.Errors) == 0 && d.partial != nil {
		d.Connector = d.partial
	}
}

// Connectors returns the valid resources, in load order.
func (s *Set) Connectors() []*Connector {
	var out []*Connector
	for _, d := range s.Documents {
		if d.Connector != nil {
			out = append(out, d.Connector)
		}
	}
	return out
}

// Err returns every error of every document joined (nil when all are
// valid). [Errors] takes it apart.
func (s *Set) Err() error {
	var all []*FieldError
	for _, d := range s.Documents {
		all = append(all, d.Errors...)
	}
	return joinErrors(all)
}

type load struct {
	Loader
	set       *Set
	seen      map[string]bool
	v         *validator.Validate
	protocols protocolList
	blockVals map[reflect.Type]*validator.Validate // per protocol block type
	creds     reflect.Type                         // what spec.broker.credentials decodes through
}

// blockValidator returns the validator of a protocol block's type: this
// package's rules and the protocol's own.
func (ld *load) blockValidator(t reflect.Type, rules map[string]Rule) *validator.Validate {
	if v, ok := ld.blockVals[t]; ok {
		return v
	}
	v := newValidator(ld.protocols)
	for tag, r := range rules {
		valid := r.Valid
		mustRegister(v, tag, func(fl validator.FieldLevel) bool { return valid(fl.Field()) })
	}
	if ld.blockVals == nil {
		ld.blockVals = map[reflect.Type]*validator.Validate{}
	}
	ld.blockVals[t] = v
	return v
}

func (ld *load) fsys() fs.FS {
	if ld.FS == nil {
		return osFS{}
	}
	return ld.FS
}

func (ld *load) join(dir, name string) string {
	if ld.FS == nil {
		return filepath.Join(dir, name)
	}
	return path.Join(dir, name)
}

// relTo returns a function resolving paths written in file.
func (ld *load) relTo(file string) func(string) string {
	return func(p string) string {
		if p == "" {
			return ""
		}
		if ld.FS == nil {
			if filepath.IsAbs(p) {
				return p
			}
			return filepath.Join(filepath.Dir(file), p)
		}
		if strings.HasPrefix(p, "/") {
			return p
		}
		return path.Join(path.Dir(file), p)
	}
}

func (ld *load) pathError(p, rule, msg, hint string) {
	ld.set.Documents = append(ld.set.Documents, &Document{
		Source: Position{File: p},
		Errors: []*FieldError{{Position: Position{File: p}, Rule: rule, Message: msg, Hint: hint}},
	})
}

func (ld *load) path(p string) {
	fsys := ld.fsys()
	info, err := fs.Stat(fsys, p)
	if err != nil {
		ld.pathError(p, "path", "cannot be read: "+osReason(err), "check the path given to -f")
		return
	}
	if !info.IsDir() {
		if ld.file(p) == 0 {
			ld.pathError(p, "no-resources", "holds no resource", "write a Connector resource in it, or leave it out")
		}
		return
	}
	entries, err := fs.ReadDir(fsys, p)
	if err != nil {
		ld.pathError(p, "path", "cannot be listed: "+osReason(err), "")
		return
	}
	found := 0
	for _, e := range entries { // fs.ReadDir sorts by name
		name := e.Name()
		ext := strings.ToLower(path.Ext(name))
		if e.IsDir() || strings.HasPrefix(name, ".") || (ext != ".yaml" && ext != ".yml") {
			continue
		}
		found += ld.file(ld.join(p, name))
	}
	if found == 0 {
		ld.pathError(p, "no-resources", "is a directory without resources: no *.yaml or *.yml file in it holds one (subdirectories are not read)",
			"name the files to load with -f, or put resource files directly in this directory")
	}
}

func osReason(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return err.Error()
}

// file loads every document of one file and returns how many there were.
func (ld *load) file(name string) int {
	key := name
	if ld.FS == nil {
		if abs, err := filepath.Abs(name); err == nil {
			key = abs
		}
	}
	if ld.seen[key] {
		return 1 // already loaded through another path; not "empty"
	}
	ld.seen[key] = true
	data, err := ld.read(name)
	var nr *safefile.NotRegularError
	var tl *safefile.TooLargeError
	switch {
	case errors.As(err, &nr):
		ld.pathError(name, "file-not-regular", "is "+safefile.Kind(nr.Mode)+", not a regular file",
			"name a regular file: reading a pipe or a device may never end, and would stop the connector from starting or reloading")
		return 1
	case errors.As(err, &tl):
		ld.pathError(name, "file-too-large", fmt.Sprintf("is larger than %d bytes", MaxFileBytes), "split it into several files")
		return 1
	case err != nil:
		ld.pathError(name, "path", "cannot be read: "+osReason(err), "")
		return 1
	}
	docs := ld.parse(name, data)
	ld.set.Documents = append(ld.set.Documents, docs...)
	return len(docs)
}

// read returns the contents of the resource file name. Only a regular
// file is read: its type is checked before it is opened (the operating
// system's files are opened so that a pipe swapped in meanwhile cannot
// block either) and again once it is open.
func (ld *load) read(name string) ([]byte, error) {
	fsys := ld.fsys()
	info, err := fs.Stat(fsys, name)
	if err != nil {
		return nil, err
	}
	if !info.Mode().IsRegular() {
		return nil, &safefile.NotRegularError{Path: name, Mode: info.Mode().Type()}
	}
	f, err := fsys.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if info, err = f.Stat(); err != nil {
		return nil, err
	}
	if !info.Mode().IsRegular() {
		return nil, &safefile.NotRegularError{Path: name, Mode: info.Mode().Type()}
	}
	return safefile.Read(f, name, MaxFileBytes)
}

// chunk is one document's text and the number of lines before it.
type chunk struct {
	text     []byte
	lineBase int
}

// splitDocuments cuts a YAML stream at its "---" markers. A line that
// starts with "---" followed by a space, a tab or the line's end begins a
// new document wherever it appears, even inside a block scalar (YAML 1.2
// §9.1.2), so cutting there is exact. Each document is then parsed on its
// own: goccy/go-yaml v1.19.2 silently drops the document after an empty one
// ("a: 1\n---\n---\nb: 2" yields one mapping), and a syntax error in one
// document then costs only that document.
func splitDocuments(data []byte) []chunk {
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf")) // a UTF-8 byte order mark
	var out []chunk
	start, startLine, line := 0, 0, 0
	for i := 0; i <= len(data); {
		end := bytes.IndexByte(data[i:], '\n')
		next := len(data) + 1
		if end >= 0 {
			next = i + end + 1
		} else {
			end = len(data) - i
		}
		ln := data[i : i+end]
		if i > start && isDocMarker(ln) {
			out = append(out, chunk{data[start:i], startLine})
			start, startLine = i, line
		}
		line++
		i = next
	}
	return append(out, chunk{data[start:], startLine})
}

func isDocMarker(ln []byte) bool {
	rest, ok := bytes.CutPrefix(ln, []byte("---"))
	return ok && (len(rest) == 0 || rest[0] == ' ' || rest[0] == '\t' || rest[0] == '\r')
}

// Bounds on one document's structure, checked on the lexer's tokens before
// parsing: goccy/go-yaml's lexer is linear, but its parser takes time
// quadratic in the keys of one mapping and in nesting depth (20,000 keys:
// 4 s; 80,000 nested '[': 30 s). A real resource stays far below these:
// 256 routes and 1,024 allowed clients make about 4,000 tokens.
const (
	maxTokens         = 20000
	maxMappingValues  = 4096 // ':' tokens
	maxFlowDepth      = 32   // nested '[' and '{'
	maxIndicatorsLine = 8    // '-', '?', block ':', '&', '*', '!' on one line
)

// errTooComplex is returned when a document exceeds the bounds above.
type errTooComplex struct {
	what string
	line int
}

func (e *errTooComplex) Error() string { return e.what }

func checkComplexity(tokens token.Tokens) *errTooComplex {
	if len(tokens) > maxTokens {
		return &errTooComplex{fmt.Sprintf("has more than %d YAML tokens; no resource needs that many", maxTokens), 1}
	}
	values, depth, line, perLine := 0, 0, 0, 0
	for _, tk := range tokens {
		if tk.Position == nil {
			continue
		}
		if tk.Position.Line != line {
			line, perLine = tk.Position.Line, 0
		}
		switch tk.Type {
		case token.MappingValueType:
			values++
			if values > maxMappingValues {
				return &errTooComplex{fmt.Sprintf("has more than %d mapping keys; no resource needs that many", maxMappingValues), line}
			}
			if depth == 0 {
				perLine++
			}
		case token.SequenceStartType, token.MappingStartType:
			depth++
			if depth > maxFlowDepth {
				return &errTooComplex{fmt.Sprintf("nests more than %d flow collections", maxFlowDepth), line}
			}
		case token.SequenceEndType, token.MappingEndType:
			depth = max(depth-1, 0)
		case token.SequenceEntryType, token.MappingKeyType, token.AnchorType, token.AliasType, token.TagType:
			perLine++
		}
		if perLine > maxIndicatorsLine {
			return &errTooComplex{fmt.Sprintf("nests more than %d collections on one line", maxIndicatorsLine), line}
		}
	}
	return nil
}

// parseChunk parses one document's text. goccy/go-yaml is third-party code
// reading untrusted input: should it panic, the panic becomes a syntax
// error, so that one bad file cannot stop the others from being checked.
func parseChunk(text []byte) (f *ast.File, err error) {
	defer func() {
		if r := recover(); r != nil {
			f, err = nil, fmt.Errorf("the YAML parser failed on this document (%v)", r)
		}
	}()
	tokens := lexer.Tokenize(string(text))
	if e := checkComplexity(tokens); e != nil {
		return nil, e
	}
	return parser.Parse(tokens, 0, parser.AllowDuplicateMapKey())
}

// parse decodes, validates and binds every document in data.
func (ld *load) parse(file string, data []byte) []*Document {
	var docs []*Document
	for i, ch := range splitDocuments(data) {
		if i == maxDocuments {
			docs = append(docs, &Document{
				Source: Position{File: file, Line: ch.lineBase + 1},
				Errors: []*FieldError{{Position: Position{File: file, Line: ch.lineBase + 1, Column: 1}, Rule: "file-too-many-documents",
					Message: fmt.Sprintf("this file holds more than %d documents; the rest is not read", maxDocuments), Hint: "split it into several files"}},
			})
			break
		}
		f, err := parseChunk(ch.text)
		if err != nil {
			docs = append(docs, syntaxDocument(file, ch.lineBase, err))
			continue
		}
		bad := invalidUTF8(ch.text, ch.lineBase)
		for _, doc := range f.Docs {
			if doc == nil || doc.Body == nil {
				continue
			}
			if _, comment := doc.Body.(*ast.CommentGroupNode); comment {
				continue
			}
			docs = append(docs, ld.document(file, ch.lineBase, doc.Body, bad))
			bad = nil // reported once, by the chunk's first document
		}
	}
	return docs
}

func syntaxDocument(file string, lineBase int, err error) *Document {
	at := Position{File: file, Line: lineBase + 1, Column: 1}
	msg := err.Error()
	var ye yaml.Error
	var tc *errTooComplex
	if errors.As(err, &tc) {
		at.Line = tc.line + lineBase
		return &Document{
			Source: Position{File: file, Line: lineBase + 1},
			Errors: []*FieldError{{Position: at, Rule: "yaml-too-complex", Message: "this document " + tc.what, Hint: "split it, or write it more simply"}},
		}
	}
	if errors.As(err, &ye) {
		msg = ye.GetMessage()
		if tk := ye.GetToken(); tk != nil && tk.Position != nil {
			at.Line, at.Column = tk.Position.Line+lineBase, tk.Position.Column
		}
	}
	return &Document{
		Source: Position{File: file, Line: lineBase + 1},
		Errors: []*FieldError{{Position: at, Rule: "yaml-syntax", Message: "is not valid YAML: " + msg,
			Hint: "indent with spaces, not tabs; quote values that contain ': ' or start with '*', '&', '!', '%' or '@'", Err: err}},
	}
}

// document decodes, validates and binds one resource.
func (ld *load) document(file string, lineBase int, body ast.Node, bad []badByte) *Document {
	d := newDecoder(file, lineBase)
	d.sections = ld.protocols.names()
	d.creds = ld.creds
	var raw rawResource
	d.decode("", Position{}, body, reflect.ValueOf(&raw).Elem())
	// Before validation and binding, so that a field holding a byte that
	// is not UTF-8 is never bound: the YAML lexer reads such a byte as
	// U+FFFD, and a route would subscribe to a filter nobody wrote.
	for _, b := range bad {
		path := d.fieldAt(b.line, b.column)
		d.fail(path, Position{File: file, Line: b.line, Column: b.column}, "", policy.RuleInvalidUTF8,
			fmt.Sprintf("is not valid UTF-8: byte 0x%02x at column %d would be read as U+FFFD, so the value would not be the one written", b.b, b.column),
			"save the file as UTF-8: a YAML file is UTF-8 text, and so is every filter and name (a topic that is not UTF-8 cannot cross to weida)")
	}
	doc := &Document{Source: d.docPos()}
	doc.Source.Column = 0
	if raw.Metadata != nil {
		doc.Name = raw.Metadata.Name
	}
	d.validateRaw(ld.v, &raw, ld.protocols)
	b := &binder{decoder: d, ld: ld, raw: &raw, relTo: ld.relTo(file)}
	b.bind()
	doc.partial, doc.dec = b.c, d
	if d.dropped > 0 {
		d.errs = append(d.errs, &FieldError{Position: doc.Source, Rule: "too-many-errors",
			Message: fmt.Sprintf("%d more errors in this document are not shown", d.dropped), Hint: "fix the errors above first"})
	}
	doc.Errors = d.errs
	doc.Warnings = warnings(doc.partial, d)
	return doc
}

// badByte is the first byte of a line that is not UTF-8.
type badByte struct {
	line, column int // as the YAML lexer counts: columns in characters, each bad byte one
	b            byte
}

// invalidUTF8 returns the first invalid UTF-8 byte of each line of text
// that has one; lineBase lines precede text in its file. Each line's first
// only: one error per line says enough.
func invalidUTF8(text []byte, lineBase int) []badByte {
	if utf8.Valid(text) {
		return nil
	}
	var out []badByte
	line, col := lineBase+1, 1
	for i := 0; i < len(text); {
		r, n := utf8.DecodeRune(text[i:])
		switch {
		case r == '\n':
			line, col = line+1, 0
		case r == utf8.RuneError && n == 1:
			if len(out) == 0 || out[len(out)-1].line != line {
				out = append(out, badByte{line, col, text[i]})
			}
		}
		i += n
		col++
	}
	return out
}

// fieldAt returns the path of the field written at line whose key or value
// starts last at or before column: the field a byte there belongs to. It
// returns "" when no field starts on the line (a comment, a continuation
// line).
func (d *decoder) fieldAt(line, column int) string {
	best, bestCol := "", 0
	for path, fp := range d.pos {
		for _, p := range []Position{fp.key, fp.value} {
			if p.Line != line || p.Column > column || p.Column < bestCol {
				continue
			}
			if p.Column > bestCol || len(path) > len(best) || (len(path) == len(best) && path < best) {
				best, bestCol = path, p.Column
			}
		}
	}
	return best
}

// warnings points out risks that are not errors.
func warnings(c *Connector, d *decoder) []*FieldError {
	if c.Direction != policy.Inbound || c.Weida.Endpoint.Port == 0 || !c.Weida.Open() || isLoopback(c.Weida.Endpoint.Host) {
		return nil
	}
	const path = "spec.weida.listen"
	return []*FieldError{{
		Position: d.lookupPos(path, false), Field: path, Value: c.Weida.Endpoint.String(), Rule: "open-endpoint",
		Message: fmt.Sprintf("admits any client: everyone who can reach %s can subscribe and receive every bridged message", c.Weida.Endpoint.HostPort()),
		Hint:    "list the subscribers' certificate fingerprints in spec.weida.allowedClients, or listen on a loopback or private address",
	}}
}

// osFS reads the operating system's files with paths as given, unlike
// os.DirFS, which needs a root and unrooted paths. It is only used inside
// this package, where paths come from the command line.
type osFS struct{}

func (osFS) Open(name string) (fs.File, error) {
	f, err := safefile.Open(name) // refuses, without blocking, what is not a regular file
	if err != nil {
		return nil, err
	}
	return f, nil
}
func (osFS) Stat(name string) (fs.FileInfo, error)      { return os.Stat(name) }
func (osFS) ReadDir(name string) ([]fs.DirEntry, error) { return os.ReadDir(name) }
