package host

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/capability"
)

// Host owns the supervisors of every configured plugin.
type Host struct {
	cfg     *Config
	log     hclog.Logger
	version string

	sups   []*Supervisor
	byName map[string]*Supervisor

	mu      sync.Mutex
	cancel  context.CancelFunc
	started bool
	stopped bool
	wg      sync.WaitGroup
	running []runningSup // the supervisors Start started

	httpStats *Server // the HTTP side, whose counters are the host's own series
}

// runningSup is a started supervisor and how to stop it.
type runningSup struct {
	s    *Supervisor
	stop context.CancelFunc
}

// New builds a host for cfg. Nothing starts until Start.
func New(cfg *Config, log hclog.Logger, version string) *Host {
	h := &Host{cfg: cfg, log: log, version: version, byName: map[string]*Supervisor{}}
	for _, pc := range cfg.Plugins {
		s := newSupervisor(pc.Name, pc, cfg, version, log, &hostServices{h: h, caller: pc.Name})
		h.sups = append(h.sups, s)
		h.byName[pc.Name] = s
	}
	return h
}

// Config returns the host's configuration.
func (h *Host) Config() *Config { return h.cfg }

// Start scans the plugins directory, reports what it found, and starts a
// supervisor for every enabled plugin. It returns at once.
func (h *Host) Start(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.started {
		return fmt.Errorf("host already started")
	}
	h.started = true
	disc, err := Discover(h.cfg.PluginsDir)
	if err != nil {
		return err
	}
	for _, w := range disc.Warnings {
		h.log.Warn(w)
	}
	for _, name := range disc.Names() {
		if _, ok := h.byName[name]; !ok {
			h.log.Info("plugin binary found but not in the config; add it under plugins: with enabled: true to run it", "plugin", name)
		}
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	h.cancel = cancel
	for _, s := range h.sups {
		if !s.cfg.Enabled {
			h.log.Info("plugin disabled in the config", "plugin", s.name)
			continue
		}
		sctx, stop := context.WithCancel(runCtx)
		h.running = append(h.running, runningSup{s: s, stop: stop})
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			s.run(sctx)
		}()
	}
	return nil
}

// Stop stops the plugins (each gets its graceful Stop, then is killed)
// and waits, at most until ctx is done. Safe to call twice and before
// Start.
//
// It stops them in two waves, each in parallel: first every plugin that
// provides no tasks, then the task providers. A worker plugin drains while
// the plugins its tasks run in still answer, so a deploy does not fail the
// tasks it was running.
func (h *Host) Stop(ctx context.Context) error {
	h.mu.Lock()
	if !h.started || h.stopped {
		h.mu.Unlock()
		return nil
	}
	h.stopped = true
	running := h.running
	cancel := h.cancel
	h.mu.Unlock()
	if cancel == nil { // Start failed before it started anything
		return nil
	}
	defer cancel()

	var first, second []runningSup
	for _, r := range running {
		if r.s.Status().Has(capability.Tasks) {
			second = append(second, r)
		} else {
			first = append(first, r)
		}
	}
	for _, wave := range [][]runningSup{first, second} {
		for _, r := range wave {
			r.stop()
		}
		for _, r := range wave {
			select {
			case <-r.s.done:
			case <-ctx.Done():
				// Out of time: kill what still runs, so no plugin (in
				// its own process group) outlives the host.
				for _, r := range running {
					r.s.KillNow()
				}
				return fmt.Errorf("plugins still stopping: %w", ctx.Err())
			}
		}
	}
	h.wg.Wait() // every run has returned: only its goroutine's exit is left
	return nil
}

// Plugins returns every configured plugin's status, in config order.
func (h *Host) Plugins() []Status {
	out := make([]Status, 0, len(h.sups))
	for _, s := range h.sups {
		out = append(out, s.Status())
	}
	return out
}

// Plugin returns the named plugin's supervisor.
func (h *Host) Plugin(name string) (*Supervisor, bool) {
	s, ok := h.byName[name]
	return s, ok
}

// hostServices is the HostServices the host serves to one plugin; caller
// is that plugin's name, bound when the plugin starts.
type hostServices struct {
	h      *Host
	caller string
}

// metricsTimeout bounds one plugin's CollectMetrics on behalf of another.
const metricsTimeout = 5 * time.Second

func (hs *hostServices) ListPlugins(_ context.Context, c capability.Capability) ([]capability.PluginInfo, error) {
	var out []capability.PluginInfo
	if c == "" || c == capability.Metrics {
		// The host's own series, for the metrics plugin (fp_host_...).
		out = append(out, capability.PluginInfo{Name: HostMetricsSource, Version: hs.h.version,
			State: string(StateRunning), Capabilities: []capability.Capability{capability.Metrics}})
	}
	for _, st := range hs.h.Plugins() {
		if !st.Enabled {
			continue
		}
		// A plugin that never started has no known capabilities yet; it
		// is listed so an aggregator reports it as down instead of
		// silently forgetting it. A crashed one keeps its last known list.
		if c != "" && !st.Has(c) && len(st.Capabilities) > 0 {
			continue
		}
		out = append(out, capability.PluginInfo{
			Name: st.Name, Version: st.Version, State: string(st.State), Capabilities: st.Capabilities,
		})
	}
	return out, nil
}

func (hs *hostServices) target(name string, c capability.Capability) (*capability.Client, error) {
	s, ok := hs.h.Plugin(name)
	if !ok {
		return nil, fmt.Errorf("no plugin %q: %w", name, capability.ErrNotFound)
	}
	client, st, err := s.Client()
	if err != nil {
		return nil, err
	}
	if !st.Has(c) {
		return nil, fmt.Errorf("plugin %q has no %s capability: %w", name, c, capability.ErrNotFound)
	}
	return client, nil
}

func (hs *hostServices) CollectMetrics(ctx context.Context, name string) (capability.MetricsPayload, error) {
	if name == HostMetricsSource {
		return hs.h.hostMetrics(), nil
	}
	client, err := hs.target(name, capability.Metrics)
	if err != nil {
		return capability.MetricsPayload{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, metricsTimeout)
	defer cancel()
	return client.CollectMetrics(ctx)
}

func (hs *hostServices) ListTasks(ctx context.Context, name string) ([]capability.TaskSpec, error) {
	client, err := hs.target(name, capability.Tasks)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, metricsTimeout)
	defer cancel()
	return client.ListTasks(ctx)
}

func (hs *hostServices) RunTask(ctx context.Context, name string, run capability.TaskRun, events capability.TaskEvents) (json.RawMessage, error) {
	client, err := hs.target(name, capability.Tasks)
	if err != nil {
		return nil, err
	}
	return client.RunTask(ctx, run, events)
}

// StreamProvider implements capability.TaskStreamRelay: the client of a
// running plugin that serves streams of attempts.
func (hs *hostServices) StreamProvider(_ context.Context, name string) (*capability.Client, error) {
	client, err := hs.target(name, capability.Tasks)
	if err != nil {
		return nil, err
	}
	if s, _ := hs.h.Plugin(name); !s.Status().Has(capability.TasksStream) {
		return nil, fmt.Errorf("plugin %q runs its tasks one call each (it lists no %s capability): %w", name, capability.TasksStream, capability.ErrUnimplemented)
	}
	return client, nil
}

// connectTimeout bounds a provider's OpenTaskListener.
const connectTimeout = 5 * time.Second

// ConnectTasks implements capability.TaskConnector: it has a running
// provider that lists the direct capability allow the caller's client
// certificate on its own listener of attempts.
func (hs *hostServices) ConnectTasks(ctx context.Context, name string, clientCert []byte) (capability.TaskListener, error) {
	client, err := hs.StreamProvider(ctx, name)
	if err != nil {
		return capability.TaskListener{}, err
	}
	if s, _ := hs.h.Plugin(name); !s.Status().Has(capability.TasksDirect) {
		return capability.TaskListener{}, fmt.Errorf("plugin %q takes its stream of attempts through the host (it lists no %s capability): %w", name, capability.TasksDirect, capability.ErrUnimplemented)
	}
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	return client.OpenTaskListener(ctx, clientCert)
}

// SubmitTasks hands the caller's submits to the plugin that takes them
// (the task system, tasks_worker), naming the caller.
func (hs *hostServices) SubmitTasks(ctx context.Context, tasks []capability.TaskSubmission) ([]capability.SubmittedTask, error) {
	var configured []string
	for _, st := range hs.h.Plugins() {
		if !st.Enabled {
			continue
		}
		if st.Has(capability.TaskSubmit) {
			client, err := hs.target(st.Name, capability.TaskSubmit)
			if err != nil {
				return nil, fmt.Errorf("the task system (plugin %s) cannot take tasks now: %w", st.Name, err)
			}
			return client.SubmitTasks(ctx, hs.caller, tasks)
		}
		if len(st.Capabilities) == 0 { // not started yet: it may be the one
			configured = append(configured, st.Name)
		}
	}
	if len(configured) > 0 {
		return nil, fmt.Errorf("no running plugin takes tasks yet (not started: %v); enable tasks_worker, or retry once it runs: %w", configured, capability.ErrUnavailable)
	}
	return nil, fmt.Errorf("no plugin takes tasks: enable tasks_worker in the host's config: %w", capability.ErrUnavailable)
}
