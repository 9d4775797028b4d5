package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/taskhost/taskhost/host"
)

// tasksPlugin is the plugin whose binary runs the task system's commands,
// `host bench` and `host migrate`: the host itself links no broker.
const tasksPlugin = "tasks_worker"

// tasksCmd runs `host <cmd> args` as `fp-plugin-tasks_worker <cmd> args`,
// replacing this process: the binary gets the same arguments, standard
// streams, environment and working directory, and its exit status is the
// command's. The binary is found as `host check-config` finds plugins:
// plugins_dir of the config file (-config when the command takes it, else
// $TASKHOST_CONFIG, else taskhost.yaml), bin/plugins when there is no such
// file, and it is not run when it does not match the plugin's sha256 pin.
func tasksCmd(cmd string, args []string, takesConfig bool) int {
	path := os.Getenv("TASKHOST_CONFIG")
	if path == "" {
		path = "taskhost.yaml"
	}
	if takesConfig {
		if p, ok := configArg(args); ok {
			path = p
		}
	}
	bin, err := tasksBinary(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "host %s: %v\n", cmd, err)
		return 1
	}
	argv := append([]string{bin, cmd}, args...)
	err = syscall.Exec(bin, argv, os.Environ()) // returns only on failure
	fmt.Fprintf(os.Stderr, "host %s: running %s: %v\n", cmd, bin, err)
	return 1
}

// configArg returns the value of the last -config flag in args as the
// flag package reads `host migrate`'s flags, all of which take a value
// (-config F, -config=F, --config F); "--" or the first argument that is
// not a flag ends the flags.
func configArg(args []string) (string, bool) {
	var path string
	found := false
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || a == "-" || !strings.HasPrefix(a, "-") {
			break
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(a[1:], "-"), "=")
		if name == "h" || name == "help" {
			break
		}
		if !hasValue {
			if i+1 == len(args) {
				break
			}
			i++
			value = args[i]
		}
		if name == "config" {
			path, found = value, true
		}
	}
	return path, found
}

// tasksBinary returns the tasks_worker plugin binary that the config at
// path names, or says why there is none to run.
func tasksBinary(path string) (string, error) {
	dir, where := host.DefaultPluginsDir, "the default plugins_dir: "+path+" does not exist"
	var pin string
	cfg, err := host.LoadConfig(path)
	switch {
	case err == nil:
		dir, where = cfg.PluginsDir, "the plugins_dir of "+path
		if pc, ok := cfg.Plugin(tasksPlugin); ok {
			pin = pc.SHA256
		}
	case !errors.Is(err, fs.ErrNotExist):
		where = fmt.Sprintf("the default plugins_dir: the config did not load: %v", err)
	}
	bin := filepath.Join(dir, host.BinaryPrefix+tasksPlugin)
	if info, err := os.Stat(bin); err != nil || info.IsDir() || info.Mode().Perm()&0o111 == 0 {
		return "", fmt.Errorf("this command runs in the %s plugin's binary, and there is no executable %s (%s); build it with `make build`, or set plugins_dir to the directory that holds it", tasksPlugin, bin, where)
	}
	if pin != "" {
		ok, err := matchesPin(bin, pin)
		if err != nil {
			return "", fmt.Errorf("reading %s: %v", bin, err)
		}
		if !ok {
			// Never run a binary the host would refuse to start.
			return "", fmt.Errorf("%s does not match its sha256 pin in the config: the binary changed; update plugins.%s.sha256 to the output of `sha256sum %s` if the change is intended; not run", bin, tasksPlugin, bin)
		}
	}
	return bin, nil
}

// matchesPin reports whether the file at path has the SHA-256 pin (hex).
func matchesPin(path, pin string) (bool, error) {
	want, err := hex.DecodeString(pin) // validated by the config parser
	if err != nil {
		return false, err
	}
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return false, err
	}
	return bytes.Equal(h.Sum(nil), want), nil
}
