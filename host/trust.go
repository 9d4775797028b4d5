package host

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
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
func pluginCommand(f *os.File, path string) *exec.Cmd {
	cmd := exec.Command(fmt.Sprintf("/proc/self/fd/%d", childBinaryFD))
	cmd.Args = []string{path}
	cmd.ExtraFiles = []*os.File{f}
	// Its own process group, so that killing it ends what it started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
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

// openBinary opens the plugin's binary at path for a start and checks it.
func (s *Supervisor) openBinary(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, &permanentError{fmt.Errorf("no binary %s: build it (make build) or drop it in %s, then press Restart", path, s.host.PluginsDir)}
	}
	info, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if info.Mode().Perm()&0o111 == 0 {
		f.Close()
		return nil, &permanentError{fmt.Errorf("%s is not executable (chmod +x it), then press Restart", path)}
	}
	return f, nil
}
