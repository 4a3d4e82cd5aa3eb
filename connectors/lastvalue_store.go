package connectors

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/fxamacker/cbor/v2"
	"github.com/prometheus/client_golang/prometheus"

	"weida.dev/connector/internal/safefile"
	"weida.dev/connector/weida"
)

// Persistence of a last-value cache (spec.lastValue.persist): for sources
// whose broker keeps nothing to seed the cache from again, the cache is
// written to <state dir>/lastvalue/<resource>.cbor shortly after it
// changes and when the resource stops, and read back before the resource
// first hosts its path. The file is written whole to a temporary file,
// synced and renamed over the old one (safefile.Create), so a crash leaves
// the old file or the new one, never a mix. A file that cannot be used
// (damaged, from another configuration, over the bounds) never stops the
// resource: it is counted in last_value_restore_failures_total, logged, and
// the cache starts empty; the next save replaces it.

// lvSaveDelay is how long after a change the cache is written: at most
// this much of the updates is lost when the process dies without stopping.
const lvSaveDelay = 2 * time.Second

// lvFileVersion is the format of the file; another is refused.
const lvFileVersion = 1

// Reasons of last_value_restore_failures_total.
const (
	RestoreUnreadable = "unreadable"      // not a regular file, larger than the bounds allow, or a read error
	RestoreMalformed  = "malformed"       // not a cache file of this format
	RestoreOther      = "another-config"  // written for another resource name or other routes
	RestoreVersion    = "unknown-version" // written by a format this connector does not know
)

// lvFile is the file's content, CBOR with integer keys.
type lvFile struct {
	Version  int           `cbor:"0,keyasint"`
	Resource string        `cbor:"1,keyasint"`
	Routes   []string      `cbor:"2,keyasint"` // the broker filters, in the resource's order
	Entries  []lvFileEntry `cbor:"3,keyasint"` // the topic updated longest ago first
}

type lvFileEntry struct {
	Topic          string `cbor:"0,keyasint"`
	ContentType    string `cbor:"1,keyasint,omitempty"`
	Traceparent    string `cbor:"2,keyasint,omitempty"`
	Tracestate     string `cbor:"3,keyasint,omitempty"`
	SourceSequence uint64 `cbor:"4,keyasint,omitempty"`
	Payload        []byte `cbor:"5,keyasint"`
}

// lvDisk is where one cache persists. Its methods are safe for concurrent
// use and do nothing on a nil lvDisk.
type lvDisk struct {
	path     string
	resource string
	routes   []string
	log      *slog.Logger
	failures *prometheus.CounterVec // resource, reason

	restored sync.Once
	saveMu   sync.Mutex // one save at a time, so the last snapshot is the one written

	mu      sync.Mutex
	dirty   bool        // changed since the last snapshot saved
	pending *time.Timer // a save scheduled; nil when none is
}

var lvEnc = func() cbor.EncMode {
	em, err := cbor.CoreDetEncOptions().EncMode()
	if err != nil {
		panic(err)
	}
	return em
}()

// persistIn makes lv persist in dir, for the resource and its broker
// filters. A nil lv or an empty dir does nothing.
func (lv *lastValues) persistIn(dir string, routes []string, m *Metrics, log *slog.Logger) {
	if lv == nil || dir == "" {
		return
	}
	lv.disk = &lvDisk{
		path:     filepath.Join(dir, "lastvalue", lv.resource+".cbor"),
		resource: lv.resource,
		routes:   slices.Clone(routes),
		log:      log,
		failures: m.LastValueRestoreFailures,
	}
}

// restore loads the file into lv, once in lv's life, before anything else
// updates it. Whatever goes wrong leaves the cache empty and the resource
// running.
func (lv *lastValues) restore() {
	if lv == nil || lv.disk == nil {
		return
	}
	d := lv.disk
	d.restored.Do(func() {
		f, reason, err := d.read(lv.maxBytes, lv.maxTopics)
		switch {
		case err == nil:
		case errors.Is(err, fs.ErrNotExist):
			d.log.Info("no saved last-value cache; it starts empty", "file", d.path)
			return
		default:
			d.failures.WithLabelValues(d.resource, reason).Inc()
			d.log.Warn("the saved last-value cache cannot be used; it starts empty, and the file is replaced at the next save",
				"file", d.path, "reason", reason, "err", err)
			return
		}
		none := &Message{}
		for i := range f.Entries {
			e := &f.Entries[i]
			lv.record(none, &weida.Message{Topic: e.Topic, ContentType: e.ContentType, Traceparent: e.Traceparent,
				Tracestate: e.Tracestate, SourceSequence: e.SourceSequence, Payload: e.Payload})
		}
		d.log.Info("last-value cache restored from the state directory", "file", d.path, "topics", len(f.Entries))
	})
}

// read decodes the file, bounded by what a cache of maxBytes and maxTopics
// can have written, and checks that it belongs to this resource.
func (d *lvDisk) read(maxBytes int64, maxTopics int) (*lvFile, string, error) {
	b, err := safefile.ReadFile(d.path, maxBytes+maxBytes/8+64<<10)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "", err
	}
	if err != nil {
		return nil, RestoreUnreadable, err
	}
	dm, err := cbor.DecOptions{
		DupMapKey:        cbor.DupMapKeyEnforcedAPF,
		IndefLength:      cbor.IndefLengthForbidden,
		TagsMd:           cbor.TagsForbidden,
		MaxArrayElements: max(maxTopics, 16),
		UTF8:             cbor.UTF8RejectInvalid,
	}.DecMode()
	if err != nil {
		return nil, RestoreMalformed, err
	}
	var f lvFile
	if err := dm.Unmarshal(b, &f); err != nil {
		return nil, RestoreMalformed, err
	}
	switch {
	case f.Version != lvFileVersion:
		return nil, RestoreVersion, fmt.Errorf("format version %d, this connector reads %d", f.Version, lvFileVersion)
	case f.Resource != d.resource:
		return nil, RestoreOther, fmt.Errorf("written for resource %q", f.Resource)
	case !slices.Equal(f.Routes, d.routes):
		return nil, RestoreOther, fmt.Errorf("written for the broker filters %q, the resource now has %q", f.Routes, d.routes)
	}
	seen := make(map[string]struct{}, len(f.Entries))
	for i := range f.Entries {
		t := f.Entries[i].Topic
		if len(t) > weidaMaxTopicBytes || !utf8.ValidString(t) {
			return nil, RestoreMalformed, fmt.Errorf("entry %d: topic is not a weida topic", i)
		}
		if _, dup := seen[t]; dup {
			return nil, RestoreMalformed, fmt.Errorf("entry %d: topic %q twice", i, t)
		}
		seen[t] = struct{}{}
	}
	return &f, "", nil
}

// weidaMaxTopicBytes is weida's cap on a topic (DATA key 5).
const weidaMaxTopicBytes = 256

// changed schedules a save lvSaveDelay from now, unless one is scheduled.
func (d *lvDisk) changed(lv *lastValues) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dirty = true
	if d.pending == nil {
		d.pending = time.AfterFunc(lvSaveDelay, func() { d.save(lv) })
	}
}

// flush writes the cache now (an attempt ending, a stop), unless nothing
// changed since the last save.
func (lv *lastValues) flush() {
	if lv == nil || lv.disk == nil {
		return
	}
	d := lv.disk
	d.mu.Lock()
	if d.pending != nil {
		d.pending.Stop()
		d.pending = nil
	}
	d.mu.Unlock()
	// A save the timer already started is waited for; after it, or after
	// this one, a timer that fired meanwhile finds nothing to write.
	d.save(lv)
}

// save writes a snapshot of lv. A failure is logged; the cache goes on in
// memory and the next change tries again.
func (d *lvDisk) save(lv *lastValues) {
	d.saveMu.Lock()
	defer d.saveMu.Unlock()
	d.mu.Lock()
	dirty := d.dirty
	d.dirty, d.pending = false, nil
	d.mu.Unlock()
	if !dirty {
		return
	}
	f := lvFile{Version: lvFileVersion, Resource: d.resource, Routes: d.routes}
	lv.mu.Lock()
	f.Entries = make([]lvFileEntry, 0, lv.store.Len())
	for e := lv.tail; e != nil; e = e.prev {
		f.Entries = append(f.Entries, lvFileEntry{Topic: e.m.Topic, ContentType: e.m.ContentType, Traceparent: e.m.Traceparent,
			Tracestate: e.m.Tracestate, SourceSequence: e.m.SourceSequence, Payload: e.m.Payload})
	}
	lv.mu.Unlock()
	// The entries are immutable: encoding them outside the lock is safe.
	b, err := lvEnc.Marshal(&f)
	if err == nil {
		if err = os.MkdirAll(filepath.Dir(d.path), 0o700); err == nil {
			err = safefile.Create(d.path, b, 0o600, true)
		}
	}
	if err != nil {
		d.log.Warn("saving the last-value cache failed; it is kept in memory and saved again at the next change", "file", d.path, "err", err)
		d.mu.Lock()
		d.dirty = true // the next change, or the next flush, tries again
		d.mu.Unlock()
	}
}
