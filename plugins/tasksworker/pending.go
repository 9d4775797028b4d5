package tasksworker

// The task providers tasks_worker knows of: which task each provides, and
// which plugins may still register tasks during the start-up grace, for
// a submit of a task that is not registered yet (service.PendingProviders).

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/worker"
)

// pendingRefresh is the least time between two discoveries a submit
// asks for (Pending); the watcher refreshes every providerRefresh anyway.
const pendingRefresh = time.Second

// providerSet is what the discovery of task providers found. Its methods
// are safe for concurrent use: the watcher and the submits discover.
type providerSet struct {
	host capability.HostServices
	// runner runs the provided tasks' attempts (nil without a host).
	runner *capability.TaskRunner
	reg    *worker.Registry
	log    hclog.Logger
	// until is the end of the start-up grace (unknownTaskGrace).
	until time.Time

	mu      sync.Mutex
	known   map[string]string // task -> the plugin that provides it
	listed  map[string]bool   // plugins whose tasks were listed once
	pending []string          // plugins whose tasks were never listed, at the last discovery
	at      time.Time         // of the last discovery that reached the host
}

func newProviderSet(host capability.HostServices, runner *capability.TaskRunner, reg *worker.Registry, log hclog.Logger, grace time.Duration) *providerSet {
	return &providerSet{host: host, runner: runner, reg: reg, log: log, until: time.Now().Add(grace),
		known: map[string]string{}, listed: map[string]bool{}}
}

// discover registers the tasks of the providers the host runs now.
func (ps *providerSet) discover(ctx context.Context) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if pending, ok := discoverProviders(ctx, ps.host, ps.runner, ps.reg, ps, ps.log); ok {
		ps.pending, ps.at = pending, time.Now()
	}
}

// unlisted appends plugin to pending unless its tasks were listed once:
// a provider that restarts keeps its tasks registered.
func (ps *providerSet) unlisted(pending []string, plugin string) []string {
	if ps.listed[plugin] {
		return pending
	}
	return append(pending, plugin)
}

// Pending is service.PendingProviders: during the start-up grace, the
// plugins that may provide tasks (the host lists those whose capabilities
// are not known yet too) and whose tasks were never listed, while they
// are starting or waiting to be restarted (not failed for good), after
// a discovery made now when some plugin was pending at the last one, or
// at most pendingRefresh old otherwise (so a provider that is running has
// its tasks registered before the caller looks again); none after the
// grace, or without a host.
func (ps *providerSet) Pending(ctx context.Context) []string {
	if ps == nil || ps.host == nil || !time.Now().Before(ps.until) {
		return nil
	}
	ps.mu.Lock()
	// While some plugin was pending, look again at once: it may be running
	// now (tasks_worker's own first discovery sees the plugins that start
	// beside it, itself among them, as starting).
	stale := len(ps.pending) > 0 || time.Since(ps.at) >= pendingRefresh
	ps.mu.Unlock()
	if stale {
		ps.discover(ctx)
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return slices.Clone(ps.pending)
}
