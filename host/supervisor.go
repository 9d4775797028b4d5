package host

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

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
	// ended are the instance ids of this plugin's processes seen to end,
	// newest first (see noteEnded).
	ended []string
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
			s.noteEnded(lp.instance, lp.pc)
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
