// Package safefile reads small configuration files (resources, secrets,
// certificates, keys) without letting the path decide how long that takes
// or how much memory it costs.
//
// os.ReadFile on a named pipe blocks until a writer appears, possibly
// forever, and it blocks inside a system call, where no context or signal
// reaches it; on /dev/zero it reads until memory runs out. The functions
// here refuse every file that is not a regular file, before reading a
// byte of it, and refuse a regular file larger than the caller's limit.
package safefile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// NotRegularError is returned for a path that names something other than
// a regular file (after following symbolic links): a directory, a named
// pipe, a socket or a device.
type NotRegularError struct {
	Path string
	Mode fs.FileMode // the type bits of the file found
}

func (e *NotRegularError) Error() string {
	return fmt.Sprintf("%s is %s, not a regular file", e.Path, Kind(e.Mode))
}

// TooLargeError is returned for a regular file larger than the limit the
// caller gave.
type TooLargeError struct {
	Path  string
	Limit int64
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("%s is larger than %d bytes", e.Path, e.Limit)
}

// Kind names the type of file mode m describes, with its article, for
// messages: "a named pipe (FIFO)", "a character device", ...
func Kind(m fs.FileMode) string {
	switch t := m.Type(); {
	case t&fs.ModeDir != 0:
		return "a directory"
	case t&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case t&fs.ModeSocket != 0:
		return "a socket"
	case t&fs.ModeCharDevice != 0:
		return "a character device"
	case t&fs.ModeDevice != 0:
		return "a block device"
	case t&fs.ModeSymlink != 0:
		return "a symbolic link"
	case t&fs.ModeIrregular != 0:
		return "a file of unknown type"
	case t == 0:
		return "a regular file"
	default:
		return "a special file"
	}
}

// Open opens path for reading if it is a regular file, and refuses
// anything else with a [*NotRegularError]. It never blocks on a named
// pipe: the type is checked with stat first and, since the path may be
// replaced between that check and the open, the open itself does not
// wait for a writer (O_NONBLOCK) and the opened file is checked again.
// Other errors are the [*fs.PathError]s of package os.
func Open(path string) (*os.File, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, &NotRegularError{Path: path, Mode: fi.Mode().Type()}
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	fi, err = f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		_ = f.Close()
		return nil, &NotRegularError{Path: path, Mode: fi.Mode().Type()}
	}
	// O_NONBLOCK means nothing for a regular file on the platforms this
	// runs on, so reads behave as usual.
	return f, nil
}

// ReadFile returns the contents of the regular file path, refusing
// anything else with a [*NotRegularError] (see [Open]) and a file larger
// than limit bytes with a [*TooLargeError]. It reads at most limit+1
// bytes, whatever the file claims its size is. limit must be positive.
func ReadFile(path string, limit int64) ([]byte, error) {
	f, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Read(f, path, limit)
}

// Read reads r to its end, failing with a [*TooLargeError] naming path
// when it holds more than limit bytes. It reads at most limit+1 bytes.
func Read(r io.Reader, path string, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, &TooLargeError{Path: path, Limit: limit}
	}
	return b, nil
}

// Refused reports whether err says the file itself is unfit (not regular,
// or too large), as opposed to missing or unreadable.
func Refused(err error) bool {
	var nr *NotRegularError
	var tl *TooLargeError
	return errors.As(err, &nr) || errors.As(err, &tl)
}

// ErrExists is returned by [Create] when the file already exists.
var ErrExists = errors.New("safefile: file exists")

// Create writes a new file with data and perm, atomically: a reader sees
// either no file or all of it. It never replaces an existing file, even
// one created while it was writing: it returns an error wrapping
// [ErrExists] then, and data is not written. With replace set, it
// replaces whatever is there instead.
//
// The data goes to a temporary file in the same directory, synced, then
// hard-linked to its name, which fails when the name exists (a rename when
// replacing). A file system without hard links gets a rename too, which is
// atomic but could replace a file another process created meanwhile.
func Create(file string, data []byte, perm fs.FileMode, replace bool) error {
	dir, base := filepath.Split(file)
	tmp, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", file, err)
	}
	name := tmp.Name()
	defer os.Remove(name)
	err = tmp.Chmod(perm)
	if err == nil {
		_, err = tmp.Write(data)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", file, err)
	}
	if replace {
		err = os.Rename(name, file)
	} else {
		err = os.Link(name, file)
	}
	switch {
	case err == nil:
	case errors.Is(err, fs.ErrExist):
		return fmt.Errorf("writing %s: %w", file, ErrExists)
	default:
		if _, serr := os.Lstat(file); serr == nil {
			return fmt.Errorf("writing %s: %w", file, ErrExists)
		}
		if err := os.Rename(name, file); err != nil {
			return fmt.Errorf("writing %s: %w", file, err)
		}
	}
	// The new directory entry is made durable where the platform allows;
	// a failure only weakens durability, never correctness.
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}
