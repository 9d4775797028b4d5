// Package hostproc runs a real host process: a host binary with a
// configuration file written for it, listening on a free loopback port,
// and waits until a plugin answers its health check. The tests start hosts
// with it (through internal/testhost) and so does `host bench -real-host`.
package hostproc

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// TasksWorkerHealth is the health check of the tasks_worker plugin.
const TasksWorkerHealth = "/plugin-pkg/tasks_worker/api/health"

// Options say which host to run and how.
type Options struct {
	// Host is the host binary.
	Host string
	// PluginsDir is the plugins_dir written into the configuration. The
	// host resolves a relative one against its working directory, so
	// give an absolute one unless that is meant.
	PluginsDir string
	// ConfigPath is where the configuration file is written.
	ConfigPath string
	// Config is the configuration after "listen" and "plugins_dir".
	Config string
	// Env is added to the host's environment (its plugins get what the
	// configuration's env lists of it).
	Env []string
	// Output gets the host's standard output and error.
	Output io.Writer
	// Health is the path polled until it answers 200 (default
	// TasksWorkerHealth).
	Health string
	// StartWithin bounds the wait for Health (default 90 s).
	StartWithin time.Duration
}

// Process is a running host.
type Process struct {
	// URL is the host's address, such as http://127.0.0.1:40123.
	URL    string
	cmd    *exec.Cmd
	exited chan struct{}
}

// Start writes the configuration, starts the host and waits until Health
// answers 200. It gives up, and stops the host, when ctx ends, when the
// host exits, or after StartWithin.
func Start(ctx context.Context, o Options) (*Process, error) {
	if o.Health == "" {
		o.Health = TasksWorkerHealth
	}
	if o.StartWithin == 0 {
		o.StartWithin = 90 * time.Second
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	text := fmt.Sprintf("listen: %s\nplugins_dir: %s\n", addr, o.PluginsDir) + o.Config
	if err := os.WriteFile(o.ConfigPath, []byte(text), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command(o.Host, "-config", o.ConfigPath)
	cmd.Stdout, cmd.Stderr = o.Output, o.Output
	if len(o.Env) > 0 {
		cmd.Env = append(os.Environ(), o.Env...)
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Process{URL: "http://" + addr, cmd: cmd, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	deadline := time.Now().Add(o.StartWithin)
	for {
		if resp, err := http.Get(p.URL + o.Health); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p, nil
			}
		}
		select {
		case <-p.exited:
			return nil, fmt.Errorf("the host exited before %s answered", o.Health)
		case <-ctx.Done():
			p.Stop()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.Stop()
			return nil, fmt.Errorf("%s did not answer within %s", o.Health, o.StartWithin)
		}
	}
}

// Exited is closed when the host process has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Stop sends the host SIGTERM and waits for it to exit (it stops its
// plugins first), killing it after 60 s; a plugin whose host was killed
// exits by itself once it sees its parent gone. Stop may be called more
// than once.
func (p *Process) Stop() { Terminate(p.cmd, p.exited, syscall.SIGTERM, 60*time.Second) }

// Terminate ends the started process of cmd: it sends sig and waits until
// exited is closed, and kills the process after grace. A process that has
// exited already gets no signal.
func Terminate(cmd *exec.Cmd, exited <-chan struct{}, sig os.Signal, grace time.Duration) {
	select {
	case <-exited:
		return
	default:
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-exited:
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// Binaries returns the host binary and plugins directory of a build laid
// out as `make build` lays it out (bin/host and bin/plugins), given the
// host binary, another binary beside it (bin/taskhost-bench) or a plugin
// binary in that build, as absolute paths.
func Binaries(bin string) (host, pluginsDir string, err error) {
	bin, err = filepath.Abs(bin)
	if err != nil {
		return "", "", err
	}
	dir := filepath.Dir(bin)
	if filepath.Base(dir) == "plugins" {
		dir = filepath.Dir(dir)
	}
	host, pluginsDir = filepath.Join(dir, "host"), filepath.Join(dir, "plugins")
	for _, p := range []string{host, pluginsDir} {
		if _, err := os.Stat(p); err != nil {
			return "", "", fmt.Errorf("there is no %s beside %s: run `make build`, or name the host binary of a build", p, bin)
		}
	}
	return host, pluginsDir, nil
}
