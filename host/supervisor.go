package host

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"

	"github.com/taskhost/taskhost/capability"
)

// State is where a plugin is in its life.
type State string

// Plugin states.
const (
	StateDisabled State = "disabled" // configured with enabled: false
	StateStarting State = "starting"
	StateRunning  State = "running"
	StateDegraded State = "degraded" // running, but its health check says otherwise
	StateBackoff  State = "backoff"  // crashed; waiting before the next start
	StateFailed   State = "failed"   // will not start again until an operator restarts it
	StateStopping State = "stopping"
	StateStopped  State = "stopped"
)

// Serving reports whether the plugin answers calls in this state.
func (s State) Serving() bool { return s == StateRunning || s == StateDegraded }

// Status is a snapshot of one plugin, for the admin UI and host services.
type Status struct {
	Name         string                  `json:"name"`
	Enabled      bool                    `json:"enabled"`
	State        State                   `json:"state"`
	Version      string                  `json:"version"`
	Capabilities []capability.Capability `json:"capabilities"`
	PID          int                     `json:"pid"`
	Restarts     int                     `json:"restarts"`
	LastError    string                  `json:"last_error"`
	Health       string                  `json:"health"`
	StartedAt    time.Time               `json:"started_at"`
	Actions      []capability.ActionSpec `json:"actions"`
	Binary       string                  `json:"binary"`
	Pinned       bool                    `json:"pinned"`
}

// Has reports whether the plugin serves c.
func (s Status) Has(c capability.Capability) bool {
	for _, x := range s.Capabilities {
		if x == c {
			return true
		}
	}
	return false
}

// permanentError is a start failure that retrying cannot fix (a wrong
// name, a failed checksum, an invalid config): the plugin goes straight to
// failed.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

const (
	minBackoff      = time.Second
	maxBackoff      = 60 * time.Second
	stableAfter     = time.Minute
	describeTimeout = 5 * time.Second
	configTimeout   = 15 * time.Second
	healthTimeout   = 5 * time.Second
	healthFailures  = 3
	killWait        = 5 * time.Second
	startTimeout    = 20 * time.Second
)

// Supervisor runs one plugin: start, configure, watch, health-check,
// restart with backoff, stop.
type Supervisor struct {
	name     string
	cfg      PluginConfig
	host     *Config
	version  string
	log      hclog.Logger
	services capability.HostServices
	stderr   *lineRing

	restartCh chan struct{}
	done      chan struct{}

	mu      sync.RWMutex
	st      Status
	client  *capability.Client
	crashes []time.Time
	cur     *exec.Cmd // the plugin process being watched, for KillNow
}

// KillNow kills the plugin's process group at once, when one is being
// watched: the host's last resort when its shutdown deadline passes.
func (s *Supervisor) KillNow() {
	s.mu.RLock()
	cmd := s.cur
	s.mu.RUnlock()
	killGroup(cmd)
}

func (s *Supervisor) setCur(cmd *exec.Cmd) {
	s.mu.Lock()
	s.cur = cmd
	s.mu.Unlock()
}

func newSupervisor(name string, cfg PluginConfig, hostCfg *Config, version string, log hclog.Logger, services capability.HostServices) *Supervisor {
	s := &Supervisor{
		name:      name,
		cfg:       cfg,
		host:      hostCfg,
		version:   version,
		log:       log.Named(name),
		services:  services,
		stderr:    newLineRing(200),
		restartCh: make(chan struct{}, 1),
		done:      make(chan struct{}),
	}
	s.st = Status{Name: name, Enabled: cfg.Enabled, State: StateStopped, Binary: s.binaryPath(), Pinned: cfg.SHA256 != ""}
	if !cfg.Enabled {
		s.st.State = StateDisabled
		close(s.done)
	}
	return s
}

func (s *Supervisor) binaryPath() string {
	return filepath.Join(s.host.PluginsDir, BinaryPrefix+s.name)
}

// Status returns a snapshot.
func (s *Supervisor) Status() Status {
	s.mu.RLock()
	defer s.mu.RUnlock()
	st := s.st
	st.Capabilities = append([]capability.Capability(nil), s.st.Capabilities...)
	st.Actions = append([]capability.ActionSpec(nil), s.st.Actions...)
	return st
}

// StderrTail returns the last lines the plugin wrote to stderr.
func (s *Supervisor) StderrTail() []string { return s.stderr.Lines() }

// Client returns the plugin's client when it is serving, or an error
// wrapping capability.ErrUnavailable. Callers use the client without
// holding any host lock.
func (s *Supervisor) Client() (*capability.Client, Status, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if !s.st.State.Serving() || s.client == nil {
		return nil, s.st, fmt.Errorf("plugin %s is %s: %w", s.name, s.st.State, capability.ErrUnavailable)
	}
	return s.client, s.st, nil
}

// Restart asks the supervisor to restart the plugin now: a failed plugin
// starts again with a fresh crash budget; a running one is stopped and
// started.
func (s *Supervisor) Restart() error {
	if !s.cfg.Enabled {
		return fmt.Errorf("plugin %s is disabled in the config; enable it and restart the host", s.name)
	}
	select {
	case s.restartCh <- struct{}{}:
	default:
	}
	return nil
}

func (s *Supervisor) setState(st State, mutate func(*Status)) {
	s.mu.Lock()
	s.st.State = st
	if mutate != nil {
		mutate(&s.st)
	}
	if !st.Serving() {
		s.client = nil
	}
	s.mu.Unlock()
}

// run is the supervisor's loop; it returns when ctx is done and the plugin
// has been stopped.
func (s *Supervisor) run(ctx context.Context) {
	defer close(s.done)
	backoff := minBackoff
	for {
		if ctx.Err() != nil {
			s.setState(StateStopped, nil)
			return
		}
		started := time.Now()
		lp, err := s.launch(ctx)
		if err == nil {
			var restart bool
			restart, err = s.watch(ctx, lp)
			if ctx.Err() != nil {
				s.setState(StateStopped, func(st *Status) { st.PID = 0 })
				return
			}
			if restart {
				backoff = minBackoff
				s.resetCrashes()
				continue
			}
			if time.Since(started) > stableAfter {
				backoff = minBackoff
			}
		}
		if ctx.Err() != nil {
			s.setState(StateStopped, nil)
			return
		}
		s.log.Error("plugin failed", "error", err)
		var perm *permanentError
		if errors.As(err, &perm) {
			s.setState(StateFailed, func(st *Status) { st.LastError = err.Error(); st.PID = 0 })
			if !s.waitOperator(ctx) {
				return
			}
			backoff = minBackoff
			continue
		}
		if s.recordCrash(time.Since(started)) {
			msg := fmt.Sprintf("%s; gave up after %d restarts within %s: fix the cause, then press Restart in /admin",
				err, s.host.RestartBudget, s.host.RestartWindow)
			s.log.Error("plugin is crash-looping; not restarting it", "error", msg)
			s.setState(StateFailed, func(st *Status) { st.LastError = msg; st.PID = 0 })
			if !s.waitOperator(ctx) {
				return
			}
			backoff = minBackoff
			continue
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		s.setState(StateBackoff, func(st *Status) { st.LastError = err.Error(); st.PID = 0; st.Restarts++ })
		s.log.Info("restarting plugin after backoff", "backoff", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			s.setState(StateStopped, nil)
			return
		case <-s.restartCh:
			t.Stop()
		case <-t.C:
		}
		backoff = min(backoff*2, maxBackoff)
	}
}

// recordCrash notes a crash of a plugin that ran for ran and reports
// whether the budget is spent. Only crash loops use up the budget: a
// crash after the plugin ran stableAfter or longer is not counted. Such a
// plugin does its work between crashes, and giving up on it would stop
// all of that work: tasks_worker running a task that kills its process
// (a segfault, the OOM killer) crashes once a minute or so until the
// reaper dead-letters that message after orphan_max_attempts, and with
// the same number of restarts in the budget, one such message would use
// it up and the next take the whole task system down.
func (s *Supervisor) recordCrash(ran time.Duration) bool {
	if ran >= stableAfter {
		return false
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	kept := s.crashes[:0]
	for _, t := range s.crashes {
		if now.Sub(t) < s.host.RestartWindow {
			kept = append(kept, t)
		}
	}
	s.crashes = append(kept, now)
	return len(s.crashes) > s.host.RestartBudget
}

func (s *Supervisor) resetCrashes() {
	s.mu.Lock()
	s.crashes = nil
	s.mu.Unlock()
}

// waitOperator blocks in the failed state until an operator restart (true)
// or shutdown (false).
func (s *Supervisor) waitOperator(ctx context.Context) bool {
	select {
	case <-ctx.Done():
		s.setState(StateStopped, nil)
		return false
	case <-s.restartCh:
		s.log.Info("operator restart")
		s.resetCrashes()
		return true
	}
}

type launched struct {
	pc     *plugin.Client
	cmd    *exec.Cmd
	client *capability.Client
	rpc    plugin.ClientProtocol
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
	cmd.Env = s.env()
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
		return nil, err
	}
	rpc, err := pc.Client()
	if err != nil {
		killGroup(cmd)
		pc.Kill()
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
	s.log.Info("plugin running", "pid", desc.PID, "version", desc.Version, "capabilities", fmt.Sprint(desc.Capabilities))
	return &launched{pc: pc, cmd: cmd, client: c, rpc: rpc}, nil
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

// watch waits for the plugin to exit, fail its health checks, be
// restarted by an operator, or for shutdown. It returns why it stopped and
// whether an operator asked for it.
//
// Health checks run beside the wait, one at a time, each bounded by
// healthTimeout. A plugin that does not answer one (frozen, deadlocked,
// swapped out, or answering with an error) is degraded at once, saying
// for how long it has not answered; when it answers again it is running
// again. One that has not answered for host.HungRestart, and failed at
// least healthFailures checks in a row, is killed and started again like a
// crashed one (0 turns this off: it stays degraded).
func (s *Supervisor) watch(ctx context.Context, lp *launched) (restart bool, err error) {
	s.setCur(lp.cmd)
	defer s.setCur(nil)
	t := time.NewTicker(s.host.HealthInterval)
	defer t.Stop()
	failures := 0
	lastAnswer := time.Now()
	var checking chan error // the running check's answer; nil when none runs
	for {
		select {
		case <-lp.client.Exited():
			ended := exitStatus(lp.pc, lp.cmd)
			lp.kill()
			return false, fmt.Errorf("plugin process exited unexpectedly%s%s", ended, s.stderrHint())
		case <-ctx.Done():
			s.stop(lp)
			return false, nil
		case <-s.restartCh:
			s.log.Info("operator restart")
			s.stop(lp)
			return true, nil
		case <-t.C:
			if checking == nil {
				checking = make(chan error, 1)
				go func(answer chan<- error) { answer <- s.checkHealth(ctx, lp) }(checking)
			}
		case err := <-checking:
			checking = nil
			if err == nil {
				if failures > 0 {
					s.log.Info("plugin answers its health check again", "after", time.Since(lastAnswer).Round(time.Second))
				}
				failures = 0
				lastAnswer = time.Now()
				continue
			}
			if ctx.Err() != nil {
				continue // shutting down: not the plugin's fault
			}
			failures++
			silent := time.Since(lastAnswer)
			reason := fmt.Sprintf("not answering its health check for %d s", int(silent.Seconds()))
			s.log.Warn("plugin is "+reason, "error", err, "failures", failures)
			s.mu.Lock()
			if s.st.State.Serving() && s.client == lp.client {
				s.st.State = StateDegraded
				s.st.Health = reason + " (last: " + err.Error() + ")"
			}
			s.mu.Unlock()
			if hung := s.host.HungRestart; hung > 0 && silent >= hung && failures >= healthFailures {
				lp.kill()
				return false, fmt.Errorf("plugin hung: %s (%d health checks failed in a row, hung_restart_seconds is %d), last: %w; killed it to start it again",
					reason, failures, int(hung.Seconds()), err)
			}
		}
	}
}

// checkHealth pings the connection and asks the plugin. A plugin that
// answers with a bad status is degraded, not dead.
//
// Both are bounded by healthTimeout: a plugin that is frozen (stopped,
// deadlocked, swapped out) keeps its connection open and never answers,
// and go-plugin's Ping has no deadline of its own. The goroutine of a ping
// that timed out returns when the connection closes, which killing the
// process does.
func (s *Supervisor) checkHealth(ctx context.Context, lp *launched) error {
	hctx, cancel := context.WithTimeout(ctx, healthTimeout)
	defer cancel()
	ping := make(chan error, 1)
	go func() { ping <- lp.rpc.Ping() }()
	select {
	case err := <-ping:
		if err != nil {
			return fmt.Errorf("ping: %w", err)
		}
	case <-hctx.Done():
		return fmt.Errorf("ping: no answer within %s", healthTimeout)
	}
	h, err := lp.client.CheckHealth(hctx)
	if err != nil {
		if hctx.Err() != nil && ctx.Err() == nil {
			return fmt.Errorf("health check: no answer within %s", healthTimeout)
		}
		return err
	}
	st := StateRunning
	if h.Status != capability.HealthOK {
		st = StateDegraded
	}
	health := h.Status.String()
	if h.Message != "" {
		health += ": " + h.Message
	}
	s.mu.Lock()
	if s.st.State.Serving() && s.client == lp.client {
		s.st.State = st
		s.st.Health = health
	}
	s.mu.Unlock()
	return nil
}

// stop drains the plugin with its own Stop, then kills the process.
func (s *Supervisor) stop(lp *launched) {
	s.setState(StateStopping, nil)
	ctx, cancel := context.WithTimeout(context.Background(), s.host.ShutdownTimeout)
	defer cancel()
	if err := lp.client.Stop(ctx); err != nil {
		s.log.Warn("graceful stop failed; killing", "error", err)
		killGroup(lp.cmd)
	}
	// go-plugin's Kill lets the plugin exit, then waits for every holder
	// of its output pipes: a child it started would hold it for as long as
	// the child lives. Past killWait the group is killed, which ends that
	// wait; after it, whatever the plugin left behind is killed too.
	killed := make(chan struct{})
	go func() {
		lp.pc.Kill()
		close(killed)
	}()
	select {
	case <-killed:
	case <-time.After(killWait):
		killGroup(lp.cmd)
		<-killed
	}
	killGroup(lp.cmd)
	s.setState(StateStopped, func(st *Status) { st.PID = 0 })
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
