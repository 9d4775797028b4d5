package host

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// A plugin's binary is opened once per start, and everything about it is
// decided on that open file: its checks, its sha256 pin, and the process,
// which executes the file through the descriptor (/proc/self/fd/N in the
// child), not its path. Renaming another file over the path after the
// check changes nothing: the checked file runs.
//
// What an open file does not stop is a write into the same file between
// the check and the start, which only its owner can do (a binary another
// user can write to is refused). The pin covers that too: once a binary
// runs, the kernel refuses writes to it, so the file is hashed again after
// the process started, and a plugin whose bytes changed in between is
// killed and failed.

// childBinaryFD is the descriptor the plugin's binary has in the child:
// the first of exec.Cmd's ExtraFiles.
const childBinaryFD = 3

// pluginCommand returns the command that runs the open binary f; path is
// what the plugin sees as its argv[0] (a plugin may read its name from
// it).
// When ctx ends, the process group is killed.
func pluginCommand(ctx context.Context, f *os.File, path string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, fmt.Sprintf("/proc/self/fd/%d", childBinaryFD))
	cmd.Args = []string{path}
	cmd.ExtraFiles = []*os.File{f}
	// Its own process group, so that killing it ends what it started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { killGroup(cmd); return nil }
	return cmd
}

// sha256Of hashes the whole of f, whatever its offset (which it shares
// with the plugin's copy of the descriptor).
func sha256Of(f *os.File) ([]byte, error) {
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(f, 0, 1<<62)); err != nil {
		return nil, err
	}
	return h.Sum(nil), nil
}

// matchesPin reports whether f's contents have the SHA-256 pin (hex).
func matchesPin(f *os.File, pin string) (bool, error) {
	want, err := hex.DecodeString(pin)
	if err != nil {
		return false, fmt.Errorf("sha256 pin %q is not hex", pin)
	}
	got, err := sha256Of(f)
	if err != nil {
		return false, err
	}
	return bytes.Equal(got, want), nil
}

// Who may change what runs. A plugin runs as the host's user (often
// root), so its binary, the plugins directory and every directory above it
// must be out of reach of anyone else: owned by root or the host's user,
// and writable by neither group nor others. A directory above may be
// writable by all when it has the sticky bit and root owns it, as /tmp
// does: in it, nobody can rename or remove what another user owns. The
// plugins directory itself may not, since anyone could add a binary there.
// A symbolic link in the plugins directory must point to a file in it.
//
// These are checked when the directory is scanned and again before every
// start, on the file that is then executed.

// hostUID is the user the host runs as; tests change it.
var hostUID = os.Geteuid()

// trustedOwner reports whether uid may own what a plugin runs from.
func trustedOwner(uid uint32) bool { return uid == 0 || int(uid) == hostUID }

// chownHint is the command that gives path to the host's user.
func chownHint(path string) string {
	who := "root"
	if hostUID != 0 {
		who = strconv.Itoa(hostUID)
		if u, err := user.LookupId(who); err == nil {
			who = u.Username
		}
	}
	return fmt.Sprintf("`chown %s %s`", who, path)
}

func ownerOf(info os.FileInfo) uint32 {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return st.Uid
	}
	return 0
}

// trustDir checks one directory: the plugins directory itself (top) or
// one above it.
func trustDir(path string, info os.FileInfo, top bool, pluginsDir string) error {
	if uid := ownerOf(info); !trustedOwner(uid) && !top {
		return fmt.Errorf("plugins directory %s is not trusted: it is inside %s, which is owned by uid %d, not by root or the user this host runs as (uid %d), so that user can swap the plugins, which run as this host's user; move plugins_dir to a directory that only root or this host's user controls (such as /opt/taskhost/plugins)",
			pluginsDir, path, uid, hostUID)
	} else if !trustedOwner(uid) {
		return fmt.Errorf("plugins directory %s is not trusted: %s is owned by uid %d, not by root or the user this host runs as (uid %d), so that user can replace the plugins, which run as this host's user; fix it with %s",
			pluginsDir, path, uid, hostUID, chownHint(path))
	}
	mode := info.Mode()
	if mode.Perm()&0o022 == 0 {
		return nil
	}
	if top {
		return fmt.Errorf("plugins directory %s is writable by its group or others (mode %04o): whoever can write to it can replace a plugin binary, which then runs as this host's user; fix it with `chmod go-w %s`",
			path, mode.Perm(), path)
	}
	if mode&os.ModeSticky != 0 && ownerOf(info) == 0 {
		return nil
	}
	return fmt.Errorf("plugins directory %s is not trusted: it is inside %s, which is writable by its group or others (mode %04o) without being a root-owned directory with the sticky bit like /tmp, so whoever can write there can swap the plugins; fix it with `chmod go-w %s`, or move plugins_dir",
		pluginsDir, path, mode.Perm(), path)
}

// checkPluginsDir checks the plugins directory and every directory above
// it, following symbolic links on the way (the directories the links are
// in are checked too), and returns its real path.
func checkPluginsDir(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	type seenDir struct {
		path string
		info os.FileInfo
	}
	var seen []seenDir
	links := 0
	// walk resolves path from the real directory base, component by
	// component as the kernel does ("..", then links), noting each
	// directory on the way.
	var walk func(base, path string) (string, error)
	walk = func(base, path string) (string, error) {
		cur := base
		if strings.HasPrefix(path, "/") {
			cur = "/"
		}
		info, err := os.Lstat(cur)
		if err != nil {
			return "", err
		}
		seen = append(seen, seenDir{cur, info})
		for _, part := range strings.Split(path, "/") {
			switch part {
			case "", ".":
				continue
			case "..":
				cur = filepath.Dir(cur)
				continue
			}
			next := filepath.Join(cur, part)
			info, err := os.Lstat(next)
			if err != nil {
				return "", err
			}
			switch {
			case info.Mode()&os.ModeSymlink != 0:
				if links++; links > 40 {
					return "", fmt.Errorf("plugins directory %s: too many symbolic links", dir)
				}
				target, err := os.Readlink(next)
				if err != nil {
					return "", err
				}
				if next, err = walk(cur, target); err != nil {
					return "", err
				}
			case info.IsDir():
				seen = append(seen, seenDir{next, info})
			default:
				return "", fmt.Errorf("plugins directory %s: %s is not a directory", dir, next)
			}
			cur = next
		}
		return cur, nil
	}
	realDir, err := walk("/", abs)
	if err != nil {
		return "", err
	}
	info, err := os.Stat(realDir)
	if err != nil {
		return "", err
	}
	if err := trustDir(realDir, info, true, dir); err != nil {
		return "", err
	}
	for _, d := range seen {
		if d.path == realDir {
			continue
		}
		if err := trustDir(d.path, d.info, false, dir); err != nil {
			return "", err
		}
	}
	return realDir, nil
}

// checkBinary checks a plugin binary's file (its own, not a link's).
func checkBinary(path string, info os.FileInfo) error {
	switch {
	case info.IsDir():
		return fmt.Errorf("%s is a directory, not a plugin binary", path)
	case !info.Mode().IsRegular():
		return fmt.Errorf("%s is not a regular file", path)
	case info.Mode().Perm()&0o111 == 0:
		return fmt.Errorf("%s is not executable (chmod +x it)", path)
	case !trustedOwner(ownerOf(info)):
		return fmt.Errorf("%s is owned by uid %d, not by root or the user this host runs as (uid %d), so that user can change what runs as this host's user; fix it with %s",
			path, ownerOf(info), hostUID, chownHint(path))
	case info.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("%s is writable by its group or others (mode %04o), so they can change what runs as this host's user; fix it with `chmod go-w %s`",
			path, info.Mode().Perm(), path)
	}
	return nil
}

// resolveBinary returns the file that path (fp-plugin-<name> in the
// plugins directory, whose real path is realDir) stands for: itself, or
// the file in the same directory a symbolic link points to.
func resolveBinary(path, realDir string) (string, error) {
	info, err := os.Lstat(path)
	if err != nil {
		return "", err
	}
	if info.Mode()&os.ModeSymlink == 0 {
		return filepath.Join(realDir, filepath.Base(path)), nil
	}
	target, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", fmt.Errorf("%s is a symbolic link that leads nowhere: %w", path, err)
	}
	if filepath.Dir(target) != realDir {
		return "", fmt.Errorf("%s is a symbolic link to %s, outside the plugins directory %s, where others may change it; copy the binary into the plugins directory instead (or link to a file in it)",
			path, target, realDir)
	}
	return target, nil
}

// openBinary opens the plugin's binary at path (in pluginsDir) to run
// it, after checking the plugins directory, and checks the open file. Its
// errors are permanent: they last until someone fixes the file.
func openBinary(pluginsDir, path string) (*os.File, error) {
	realDir, err := checkPluginsDir(pluginsDir)
	if os.IsNotExist(err) {
		return nil, &permanentError{fmt.Errorf("no binary %s: the plugins directory %s does not exist; build the plugins (make build) or set plugins_dir, then press Restart", path, pluginsDir)}
	}
	if err != nil {
		return nil, &permanentError{err}
	}
	file, err := resolveBinary(path, realDir)
	if os.IsNotExist(err) {
		return nil, &permanentError{fmt.Errorf("no binary %s: build it (make build) or drop it in %s, then press Restart", path, pluginsDir)}
	}
	if err != nil {
		return nil, &permanentError{err}
	}
	f, err := os.OpenFile(file, os.O_RDONLY|syscall.O_CLOEXEC|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, &permanentError{fmt.Errorf("open %s: %w; press Restart to try again", path, err)}
	}
	info, err := f.Stat()
	if err == nil {
		err = checkBinary(path, info)
	}
	if err != nil {
		f.Close()
		return nil, &permanentError{fmt.Errorf("%w, then press Restart", err)}
	}
	return f, nil
}

// OpenPluginBinary opens plugin name's binary in pluginsDir to run it,
// after every check the host makes before it starts a plugin: neither the
// plugins directory nor the binary is within reach of another user, and
// the file matches pin (hex SHA-256; "" for none). Run the returned file
// itself (its descriptor, as the host does: /proc/self/fd/N), never the
// path again, so that what runs is what was checked.
func OpenPluginBinary(pluginsDir, name, pin string) (*os.File, error) {
	path := filepath.Join(pluginsDir, BinaryPrefix+name)
	f, err := openBinary(pluginsDir, path)
	if err != nil {
		return nil, err
	}
	if pin == "" {
		return f, nil
	}
	ok, err := matchesPin(f, pin)
	if err == nil && !ok {
		err = &permanentError{pinMismatch(name, path)}
	} else if err != nil {
		err = fmt.Errorf("check the sha256 pin of %s: %w", path, err)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}
