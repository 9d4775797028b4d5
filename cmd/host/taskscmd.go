package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/taskhost/taskhost/host"
)

// The task system's own commands run in binaries of their own, so that the
// host links no broker: `host migrate` in the tasks_worker plugin's binary,
// and `host bench` in the bench's binary, which the bench module (bench/)
// builds beside the host.

// tasksPlugin is the plugin whose binary runs `host migrate`.
const tasksPlugin = "tasks_worker"

// benchBinary is the name of the bench's binary, which `make build` puts
// beside bin/host.
const benchBinary = "taskhost-bench"

// migrate runs `host migrate` as `fp-plugin-tasks_worker migrate`, handing
// it the tasks_worker plugin's config block on stdin as `host
// check-config` does, so that the plugin reads its own settings (dsn,
// schema) and the plugin's binary needs nothing of the host. The binary is
// found as check-config finds plugins: in plugins_dir of the config file
// (-config, else $TASKHOST_CONFIG, else taskhost.yaml), in bin/plugins
// when there is no such file, and it is not run when it does not match
// the plugin's sha256 pin. Its output is the command's, and so is its exit
// status.
func (cl *cli) migrate(args []string) int {
	set := flag.NewFlagSet("migrate", flag.ContinueOnError)
	set.SetOutput(cl.stderr)
	path := configFlag(set)
	dsn := set.String("dsn", "", "PostgreSQL `address` (default: the tasks_worker config's dsn, then $TASKHOST_DATABASE_URL)")
	schema := set.String("schema", "", "the `schema` holding the tables (default: the config's schema, then public)")
	set.Usage = func() {
		fmt.Fprint(set.Output(), "usage: host migrate [-config FILE] [-dsn DSN] [-schema S]\n\nBrings the PostgreSQL broker's tables up to date (in the tasks_worker plugin's binary).\n\n")
		set.PrintDefaults()
	}
	if err := set.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if set.NArg() > 0 {
		fmt.Fprintf(cl.stderr, "host migrate: unexpected argument %q: the flags are -config, -dsn and -schema\n", set.Arg(0))
		return 2
	}
	cfg, err := host.LoadConfig(*path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(cl.stderr, "host migrate: %v\n", err)
		return 1
	}
	if err != nil {
		cfg = nil
	}
	bin, f, block, err := tasksBinary(cfg, *path)
	if err != nil {
		fmt.Fprintf(cl.stderr, "host migrate: %v\n", err)
		return 1
	}
	defer f.Close()
	argv := []string{"migrate"}
	if *dsn != "" {
		argv = append(argv, "-dsn", *dsn)
	}
	if *schema != "" {
		argv = append(argv, "-schema", *schema)
	}
	return cl.runPluginBinary(bin, f, argv, block)
}

// runPluginBinary runs the open plugin binary f (at path bin) with args and
// stdin on this command's standard output and error, and returns its exit
// status. What runs is the file checked, through its descriptor, as the
// host starts plugins: a file swapped in after the checks never runs.
// SIGINT and SIGTERM are passed on to it.
func (cl *cli) runPluginBinary(bin string, f *os.File, args []string, stdin []byte) int {
	cmd := exec.Command("/proc/self/fd/3") // the first of ExtraFiles
	cmd.Args = append([]string{bin}, args...)
	cmd.ExtraFiles = []*os.File{f}
	cmd.Stdin = bytes.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = cl.stdout, cl.stderr
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(cl.stderr, "host %s: running %s: %v\n", args[0], bin, err)
		return 1
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case sig := <-sigs:
			_ = cmd.Process.Signal(sig)
		case err := <-done:
			var ee *exec.ExitError
			switch {
			case err == nil:
				return 0
			case errors.As(err, &ee) && ee.ExitCode() >= 0:
				return ee.ExitCode()
			default:
				fmt.Fprintf(cl.stderr, "host %s: %s: %v\n", args[0], bin, err)
				return 1
			}
		}
	}
}

// tasksBinary returns the path of the tasks_worker plugin binary that cfg
// (loaded from path; nil when there is no such file) names, the binary
// opened after the checks the host makes before it starts a plugin (see
// host.OpenPluginBinary), and the plugin's config block (nil without
// one), or says why there is none to run.
func tasksBinary(cfg *host.Config, path string) (string, *os.File, []byte, error) {
	dir, where := host.DefaultPluginsDir, "the default plugins_dir: "+path+" does not exist"
	var pin string
	var block []byte
	if cfg != nil {
		dir, where = cfg.PluginsDir, "the plugins_dir of "+path
		if pc, ok := cfg.Plugin(tasksPlugin); ok {
			pin, block = pc.SHA256, pc.Config
		}
	}
	bin := filepath.Join(dir, host.BinaryPrefix+tasksPlugin)
	if info, err := os.Stat(bin); err != nil || info.IsDir() || info.Mode().Perm()&0o111 == 0 {
		return "", nil, nil, fmt.Errorf("this command runs in the %s plugin's binary, and there is no executable %s (%s); build it with `make build`, or set plugins_dir to the directory that holds it", tasksPlugin, bin, where)
	}
	f, err := host.OpenPluginBinary(dir, tasksPlugin, pin)
	if err != nil {
		// Never run a binary the host would refuse to start.
		return "", nil, nil, fmt.Errorf("%w; not run", err)
	}
	return bin, f, block, nil
}

// bench runs `host bench` as the bench's own binary beside this one
// (bin/taskhost-bench, from the bench module), replacing this process: it
// gets the same arguments, standard streams, environment and working
// directory, and its exit status is the command's.
func (cl *cli) bench(args []string) int {
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(cl.stderr, "host bench: where is this host binary: %v\n", err)
		return 1
	}
	bin := filepath.Join(filepath.Dir(self), benchBinary)
	if info, err := os.Stat(bin); err != nil || info.IsDir() || info.Mode().Perm()&0o111 == 0 {
		fmt.Fprintf(cl.stderr, "host bench: the bench is a binary of its own, and there is no executable %s beside this host; build it with `make build`, which builds it from the bench module (bench/)\n", bin)
		return 1
	}
	err = syscall.Exec(bin, append([]string{bin}, args...), os.Environ()) // returns only on failure
	fmt.Fprintf(cl.stderr, "host bench: running %s: %v\n", bin, err)
	return 1
}
