package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// replaceFile writes data to path as a 0600 file. It writes a temporary
// file of the same directory and renames it over path, so that a reader
// (kubectl reading ~/.kube/config) sees the old file or the new one,
// never a part of it, and an existing file's wider mode is tightened.
//
// A file that exists keeps its owner: the rename puts a new inode in its
// place, which under sudo would otherwise hand the person's file to root.
// A new file is owned by uid:gid (-1: the process's). A symbolic link at
// path is refused rather than replaced by a file or written through (a
// link could make root write or chown a file elsewhere).
func replaceFile(path string, data []byte, uid, gid int) error {
	fi, err := os.Lstat(path)
	switch {
	case err == nil && fi.Mode()&os.ModeSymlink != 0:
		return fmt.Errorf("%s is a symbolic link: capl-dev does not write through one; name the file it points to instead", path)
	case err == nil && !fi.Mode().IsRegular():
		return fmt.Errorf("%s is not a regular file", path)
	case err == nil:
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			uid, gid = int(st.Uid), int(st.Gid)
		}
	case !errors.Is(err, os.ErrNotExist):
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	if err := fillFile(f, data, uid, gid); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
}

// fillFile writes data to the new file f, 0600 and owned by uid:gid
// (unchanged for -1 or the process's own), and closes it. The ownership
// is set through the open file (fchown), so no path is followed.
func fillFile(f *os.File, data []byte, uid, gid int) error {
	err := f.Chmod(0o600)
	if err == nil && uid >= 0 && (uid != os.Geteuid() || gid != os.Getegid()) {
		err = f.Chown(uid, gid)
	}
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// mkdirOwned makes dir and its missing parents, 0700, and gives the
// directories it made, and only those, to uid:gid (-1: the process's):
// under sudo a new ~/.kube must be the person's, while a directory that
// exists keeps its owner. Lchown: a directory replaced by a symbolic link
// in between is not followed.
func mkdirOwned(dir string, uid, gid int) error {
	var made []string
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Lstat(d); !errors.Is(err, os.ErrNotExist) {
			break
		}
		made = append(made, d)
		if filepath.Dir(d) == d {
			break
		}
	}
	if len(made) == 0 {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if uid < 0 {
		return nil
	}
	for _, d := range made {
		if err := os.Lchown(d, uid, gid); err != nil {
			return err
		}
	}
	return nil
}
