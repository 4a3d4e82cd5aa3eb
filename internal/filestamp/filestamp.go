// Package filestamp tells whether files changed, by what a stat reports:
// modification time, size and inode (device and inode on systems that have
// them). Reading a stamp follows symbolic links, so the atomic swap of a
// Kubernetes Secret or ConfigMap volume (its ..data link pointing at a new
// directory) changes the stamp of every file under it, as does a rename
// over a file, an editor's save or a truncation.
//
// It is a leaf: it imports only the standard library. Polling stamps
// costs one stat per file and needs no goroutine, no watch descriptor and
// no directory that exists yet, which suits files read at each attempt of
// a connection.
package filestamp

import (
	"os"
	"slices"
	"syscall"
)

// Stamp is what a stat said of one file. Two stamps of the same path are
// equal when nothing a writer does to the file happened in between (up to
// the file system's time resolution for an overwrite in place that keeps
// the size). The zero Stamp is the stamp of a file that could not be
// stat'ed. Stamps are comparable with ==.
type Stamp struct {
	Missing bool  // the stat failed: no such file, or no permission
	ModNano int64 // modification time, Unix nanoseconds
	Size    int64
	Dev     uint64 // 0 where the system reports none
	Ino     uint64 // 0 where the system reports none
}

// Of returns the stamp of path.
func Of(path string) Stamp {
	fi, err := os.Stat(path)
	if err != nil {
		return Stamp{Missing: true}
	}
	s := Stamp{ModNano: fi.ModTime().UnixNano(), Size: fi.Size()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.Dev, s.Ino = uint64(st.Dev), uint64(st.Ino)
	}
	return s
}

// Set is the stamps of several paths, in the order given. A nil Set is
// the stamps of no file.
type Set []Stamp

// All returns the stamps of paths, in their order.
func All(paths []string) Set {
	if len(paths) == 0 {
		return nil
	}
	out := make(Set, len(paths))
	for i, p := range paths {
		out[i] = Of(p)
	}
	return out
}

// Equal reports whether s and o hold the same stamps: taken of the same
// paths, no file changed between them.
func (s Set) Equal(o Set) bool { return slices.Equal(s, o) }
