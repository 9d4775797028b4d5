package host

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"

	"github.com/taskhost/taskhost/capability"
)

// This file starts a plugin process: it checks the binary, starts it in a
// process group of its own, checks who answers the handshake and
// configures it; and it keeps what the process writes outside its logger.

type launched struct {
	pc     *plugin.Client
	cmd    *exec.Cmd
	client *capability.Client
	rpc    plugin.ClientProtocol
	// instance is the process's instance id (capability.InstanceEnv).
	instance string
}

// killGroup sends SIGKILL to the plugin's process group: the plugin runs
// as the leader of its own group, so this ends whatever it started too,
// which would otherwise be left running when the plugin dies. A group
// that is already gone is not an error.
func killGroup(cmd *exec.Cmd) {
	if cmd != nil && cmd.Process != nil && cmd.Process.Pid > 0 {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}

// exitStatus describes how the plugin's process ended, as " (exit status
// 3)" or " (signal: killed)", or "" while it runs. go-plugin sets exited
// under its lock after its Wait returned, so ProcessState is set then.
func exitStatus(pc *plugin.Client, cmd *exec.Cmd) string {
	if !pc.Exited() || cmd.ProcessState == nil {
		return ""
	}
	return " (" + cmd.ProcessState.String() + ")"
}

// handshakeHint shortens go-plugin's error for a process that wrote
// something other than the handshake on stdout (or exited before writing
// it): its text lists causes that do not apply here.
func handshakeHint(err error) error {
	// go-plugin says one or the other, depending on whether it saw the
	// process end or its output close first.
	if msg := err.Error(); strings.Contains(msg, "Unrecognized remote plugin message") || strings.Contains(msg, "plugin exited before we could connect") {
		return errors.New("it did not answer with the plugin handshake: a taskhost plugin calls capability.Serve and writes nothing else to stdout")
	}
	return err
}

// kill ends a plugin that is dead, hung or failed its start: at once, with
// its process group, then lets go-plugin clean up (its own Kill first asks
// the plugin to exit and waits, which a frozen process never does).
func (lp *launched) kill() {
	killGroup(lp.cmd)
	lp.pc.Kill()
}

func (s *Supervisor) env() []string { return pluginEnv(s.host, s.cfg) }

// pluginEnv is a plugin process's environment: the log level, a few
// basics and the host variables its config passes (env).
func pluginEnv(host *Config, pc PluginConfig) []string {
	env := []string{"TASKHOST_LOG_LEVEL=" + host.LogLevel}
	for _, k := range []string{"PATH", "HOME", "TMPDIR", "TZ"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	for _, k := range pc.Env {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// pinMismatch says that the binary at path does not match plugin name's
// sha256 pin, and how to fix it.
func pinMismatch(name, path string) error {
	return fmt.Errorf("%s does not match its sha256 pin in the config: the binary changed; update plugins.%s.sha256 to the output of `sha256sum %s` if the change is intended", path, name, path)
}

// beforeExec, set by tests, runs after the binary was checked and before
// it is started.
var beforeExec func(name, path string)

// launch starts the process, checks who it is and configures it.
func (s *Supervisor) launch(ctx context.Context) (*launched, error) {
	s.setState(StateStarting, nil)
	path := s.binaryPath()
	f, err := OpenPluginBinary(s.host.PluginsDir, s.name, s.cfg.SHA256)
	if err != nil {
		return nil, err
	}
	// The child has its own descriptor once started.
	defer f.Close()
	if beforeExec != nil {
		beforeExec(s.name, path)
	}
	cmd := pluginCommand(context.Background(), f, path)
	// The instance variables go last: a variable of the same name passed
	// through by the config (env) must not stand for them.
	instance := newInstance()
	cmd.Env = append(s.env(), capability.InstanceEnv+"="+instance, capability.EndedEnv+"="+strings.Join(s.endedInstances(), ","))
	pc := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  capability.Handshake,
		VersionedPlugins: capability.VersionedPlugins(nil),
		Cmd:              cmd,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		AutoMTLS:         true,
		SkipHostEnv:      true,
		Logger:           goPluginLogger(s.log, cmd.Path),
		Stderr:           io.MultiWriter(s.stderr, newStderrLog(s.log.Named(filepath.Base(cmd.Path)))),
		SyncStdout:       &warnWriter{log: s.log, stream: "stdout"},
		SyncStderr:       &warnWriter{log: s.log, stream: "stderr"},
		StartTimeout:     startTimeout,
		Managed:          false,
	})
	fail := func(err error) (*launched, error) {
		killGroup(cmd)
		pc.Kill()
		s.noteEnded(instance, pc)
		return nil, err
	}
	rpc, err := pc.Client()
	if err != nil {
		killGroup(cmd)
		pc.Kill()
		s.noteEnded(instance, pc)
		// How it ended, unless that was this kill.
		ended := exitStatus(pc, cmd)
		if ended == " (signal: killed)" {
			ended = ""
		}
		return nil, fmt.Errorf("start %s: %w%s%s", path, handshakeHint(err), ended, s.stderrHint())
	}
	if s.cfg.SHA256 != "" {
		// The process runs: the kernel refuses writes to its binary now,
		// so these are the bytes it executes.
		ok, err := matchesPin(f, s.cfg.SHA256)
		if err != nil {
			return fail(fmt.Errorf("check the sha256 pin of %s again: %w", path, err))
		}
		if !ok {
			return fail(&permanentError{fmt.Errorf("%s was written to while it was being started: it no longer matches its sha256 pin; the process was killed. Install a binary with a new name and rename() it into place, then press Restart", path)})
		}
	}
	c, err := capability.FromRPC(rpc)
	if err != nil {
		return fail(err)
	}
	dctx, cancel := context.WithTimeout(ctx, describeTimeout)
	desc, err := c.Describe(dctx)
	cancel()
	if err != nil {
		return fail(fmt.Errorf("describe: %w%s", err, s.stderrHint()))
	}
	if desc.Name != s.name {
		return fail(&permanentError{fmt.Errorf("binary %s says its name is %q, but it is configured as %q: it is the wrong binary, or rename the config key", path, desc.Name, s.name)})
	}
	if !hasVersion(desc.APIVersions, capability.ProtocolVersion) {
		return fail(&permanentError{fmt.Errorf("plugin speaks API versions %v, this host speaks %d: rebuild the plugin against this host's capability package", desc.APIVersions, capability.ProtocolVersion)})
	}
	cctx, cancel := context.WithTimeout(ctx, configTimeout)
	err = c.Configure(cctx, capability.ConfigureRequest{
		Config:      s.cfg.Config,
		Host:        s.services,
		HostVersion: s.version,
		LogLevel:    s.host.LogLevel,
	})
	cancel()
	var bad *capability.InvalidConfigError
	if errors.As(err, &bad) {
		return fail(&permanentError{fmt.Errorf("plugins.%s.config: %s; fix the config file and restart", s.name, strings.TrimPrefix(bad.Error(), "invalid config: "))})
	}
	if err != nil {
		// The client's error already starts "configure: ".
		if !strings.HasPrefix(err.Error(), "configure: ") {
			err = fmt.Errorf("configure: %w", err)
		}
		return fail(fmt.Errorf("%w%s", err, s.stderrHint()))
	}
	var actions []capability.ActionSpec
	if desc.Has(capability.Actions) {
		actx, cancel := context.WithTimeout(ctx, describeTimeout)
		actions, err = c.ListActions(actx)
		cancel()
		if err != nil {
			s.log.Warn("list actions failed; the admin UI shows none", "error", err)
		}
	}
	s.setState(StateRunning, func(st *Status) {
		st.Version = desc.Version
		st.Capabilities = desc.Capabilities
		st.PID = desc.PID
		st.Actions = actions
		st.StartedAt = time.Now()
		st.Health = "ok"
	})
	s.mu.Lock()
	s.client = c
	s.mu.Unlock()
	s.log.Info("plugin running", "pid", desc.PID, "instance", instance, "version", desc.Version, "capabilities", fmt.Sprint(desc.Capabilities))
	return &launched{pc: pc, cmd: cmd, client: c, rpc: rpc, instance: instance}, nil
}

// newInstance returns a fresh instance id (capability.InstanceEnv).
func newInstance() string {
	var b [8]byte
	_, _ = crand.Read(b[:]) // never fails (crypto/rand panics instead)
	return hex.EncodeToString(b[:])
}

// noteEnded records that the process of instance has ended, when
// go-plugin has waited on it (after its Kill, whatever ended it): the
// next process of the plugin is told (capability.EndedEnv). A process
// not known to have ended is not recorded: its work is left to the
// plugin's own means, which do not take it for dead on the host's word.
func (s *Supervisor) noteEnded(instance string, pc *plugin.Client) {
	if !pc.Exited() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if slices.Contains(s.ended, instance) {
		return
	}
	s.ended = append([]string{instance}, s.ended...)
	if len(s.ended) > capability.MaxEndedInstances {
		s.ended = s.ended[:capability.MaxEndedInstances]
	}
}

// endedInstances returns the instances noteEnded recorded, newest first.
func (s *Supervisor) endedInstances() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return slices.Clone(s.ended)
}

func hasVersion(vs []int, v int) bool {
	for _, x := range vs {
		if x == v {
			return true
		}
	}
	return false
}

func (s *Supervisor) stderrHint() string {
	lines := s.stderr.Lines()
	if len(lines) == 0 {
		return ""
	}
	last := lines[len(lines)-1]
	if len(last) > 300 {
		last = last[:300] + "..."
	}
	return " (last stderr line: " + last + ")"
}

// warnWriter logs stray plugin output at WARN, so it is seen, not lost.
type warnWriter struct {
	log    hclog.Logger
	stream string
}

func (w *warnWriter) Write(p []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		if line != "" {
			w.log.Warn("plugin wrote to "+w.stream+" directly; use the logger", "line", line)
		}
	}
	return len(p), nil
}

// lineRing keeps the last n lines written to it.
type lineRing struct {
	mu    sync.Mutex
	n     int
	lines []string
	part  string
}

func newLineRing(n int) *lineRing { return &lineRing{n: n} }

func (r *lineRing) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.part + string(p)
	parts := strings.Split(s, "\n")
	r.part = parts[len(parts)-1]
	r.lines = append(r.lines, parts[:len(parts)-1]...)
	if len(r.lines) > r.n {
		r.lines = append([]string(nil), r.lines[len(r.lines)-r.n:]...)
	}
	return len(p), nil
}

func (r *lineRing) Lines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.lines...)
}
