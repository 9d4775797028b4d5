package main

import (
	"errors"
	"fmt"
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
	bin, f, err := tasksBinary(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "host %s: %v\n", cmd, err)
		return 1
	}
	// Run the file that was checked, through its descriptor, as the host
	// starts plugins: a file swapped in after the checks never runs.
	argv := append([]string{bin, cmd}, args...)
	err = syscall.Exec(fmt.Sprintf("/proc/self/fd/%d", f.Fd()), argv, os.Environ()) // returns only on failure
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

// tasksBinary returns the path of the tasks_worker plugin binary that
// the config at path names, and the binary opened after the checks the
// host makes before it starts a plugin (see host.OpenPluginBinary), or
// says why there is none to run.
func tasksBinary(path string) (string, *os.File, error) {
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
		return "", nil, fmt.Errorf("this command runs in the %s plugin's binary, and there is no executable %s (%s); build it with `make build`, or set plugins_dir to the directory that holds it", tasksPlugin, bin, where)
	}
	f, err := host.OpenPluginBinary(dir, tasksPlugin, pin)
	if err != nil {
		// Never run a binary the host would refuse to start.
		return "", nil, fmt.Errorf("%w; not run", err)
	}
	return bin, f, nil
}
