package service

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
)

// DefaultDebounce is how long a [Watcher] waits after the last change of a
// burst before it reports the burst, when [WatchOptions.Debounce] is zero.
const DefaultDebounce = 250 * time.Millisecond

// WatchOptions configure [NewWatcher].
type WatchOptions struct {
	// Debounce is how quiet the files must stay after a change before the
	// change is reported: an editor's save or a Kubernetes ConfigMap
	// update is several file operations, reported once. Zero means
	// [DefaultDebounce].
	Debounce time.Duration
	// Logger receives the watcher's own failures; nil means slog.Default.
	Logger *slog.Logger
}

// Watcher reports changes to resource files. It watches directories, not
// files: an atomic update replaces a file (a rename over it, or the
// ..data symlink swap of a Kubernetes ConfigMap volume), and a watch on
// the replaced file would see nothing after the first update.
//
// For a directory path it reports changes of its *.yaml and *.yml files
// and of entries named "..something" (the ConfigMap's own); for a file
// path, changes of that name and of "..something" entries in its
// directory. Other files (an editor's swap file, say) are ignored.
type Watcher struct {
	w       *fsnotify.Watcher
	log     *slog.Logger
	wait    time.Duration
	watched map[string]func(name string) bool // directory → which names in it matter
	changes chan struct{}
	stop    chan struct{}
	done    sync.WaitGroup
	closing sync.Once
}

// NewWatcher watches paths, files and directories as `connector run -f`
// takes them, and starts the goroutine that reports their changes on
// [Watcher.Changes]. Close stops it. It fails when a path cannot be
// watched.
func NewWatcher(paths []string, o WatchOptions) (*Watcher, error) {
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("service: watching resource files: %w", err)
	}
	w := &Watcher{
		w: fw, log: o.Logger, wait: o.Debounce, watched: map[string]func(string) bool{},
		changes: make(chan struct{}, 1), stop: make(chan struct{}),
	}
	if w.log == nil {
		w.log = slog.Default()
	}
	if w.wait <= 0 {
		w.wait = DefaultDebounce
	}
	for _, p := range paths {
		if err := w.add(p); err != nil {
			fw.Close()
			return nil, err
		}
	}
	w.done.Go(w.loop)
	return w, nil
}

func (w *Watcher) add(p string) error {
	info, err := os.Stat(p)
	if err != nil {
		return fmt.Errorf("service: watching %s: %w", p, err)
	}
	dir, match := filepath.Clean(p), isResourceFile
	if !info.IsDir() {
		dir = filepath.Dir(dir)
		base := filepath.Base(p)
		match = func(name string) bool { return name == base || strings.HasPrefix(name, "..") }
	}
	if prev, ok := w.watched[dir]; ok {
		w.watched[dir] = func(name string) bool { return prev(name) || match(name) }
		return nil
	}
	if err := w.w.Add(dir); err != nil {
		return fmt.Errorf("service: watching %s: %w", dir, err)
	}
	w.watched[dir] = match
	return nil
}

// isResourceFile reports whether a change of name, in a watched directory,
// may change what the loader reads there.
func isResourceFile(name string) bool {
	if strings.HasPrefix(name, "..") {
		return true
	}
	if strings.HasPrefix(name, ".") {
		return false
	}
	ext := filepath.Ext(name)
	return ext == ".yaml" || ext == ".yml"
}

// Changes delivers one value after each burst of changes has settled.
// Values are not queued: a burst while the previous one is unread is
// reported with it.
func (w *Watcher) Changes() <-chan struct{} { return w.changes }

// Close stops watching and waits for the watcher's goroutine to end. It
// may be called more than once.
func (w *Watcher) Close() error {
	var err error
	w.closing.Do(func() {
		close(w.stop)
		w.done.Wait()
		err = w.w.Close()
	})
	return err
}

func (w *Watcher) loop() {
	// Stopped until the first change; since Go 1.23 a stopped timer
	// delivers no stale value, so Reset needs no draining.
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-w.stop:
			return
		case ev, ok := <-w.w.Events:
			if !ok {
				return
			}
			if ev.Op == fsnotify.Chmod || !w.matters(ev.Name) {
				continue
			}
			timer.Reset(w.wait) // a burst is reported once, when it has settled
		case err, ok := <-w.w.Errors:
			if !ok {
				return
			}
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				// Events were lost: report a change, since one may be among them.
				timer.Reset(w.wait)
			}
			w.log.Warn("watching resource files", "err", err)
		case <-timer.C:
			select {
			case w.changes <- struct{}{}:
			default: // one is pending already
			}
		}
	}
}

func (w *Watcher) matters(path string) bool {
	match, ok := w.watched[filepath.Dir(path)]
	return ok && match(filepath.Base(path))
}
