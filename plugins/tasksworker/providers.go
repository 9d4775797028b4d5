package tasksworker

// Tasks provided by other plugins: discovered through the host and run
// in their plugin.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/worker"
)

// providerRefresh is how often tasks_worker asks the host which plugins
// provide tasks; a provider that starts later is picked up within it.
const providerRefresh = 5 * time.Second

// unknownTaskGrace is how long after tasks_worker starts a message of a
// task it does not know yet waits (requeued, its attempt given back)
// instead of failing: a provider plugin may start after tasks_worker, or
// restart, and its tasks are registered only when a refresh finds it.
const unknownTaskGrace = 12 * providerRefresh

// unknownTaskWait is how long messages of a task that no live worker runs
// wait for one before they fail as unknown (worker.Options.UnknownTaskWait):
// long enough for the only host that runs it to be deployed again, or its
// provider plugin to be restarted.
const unknownTaskWait = 10 * time.Minute

// watchProviders registers the tasks of every plugin with the TaskProvider
// capability, now and whenever one appears. A task stays registered when
// its provider goes down: its messages are still accepted, and an attempt
// while the provider is down fails with a clear error and is retried by
// the task's rules.
func watchProviders(ctx context.Context, ps *providerSet) {
	if ps.host == nil {
		return
	}
	every := time.NewTicker(providerRefresh)
	defer every.Stop()
	for {
		ps.discover(ctx)
		select {
		case <-ctx.Done():
			return
		case <-every.C:
		}
	}
}

// discoverProviders registers the tasks of the providers the host runs,
// and returns the plugins that may provide tasks whose tasks it has never
// listed (not running yet, or their list failed); false when the host
// could not be asked.
func discoverProviders(ctx context.Context, host capability.HostServices, runner *capability.TaskRunner, reg *worker.Registry, ps *providerSet, log hclog.Logger) ([]string, bool) {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	plugins, err := host.ListPlugins(lctx, capability.Tasks)
	if err != nil {
		log.Debug("cannot list task providers", "error", err)
		return nil, false
	}
	known := ps.known
	var pending []string
	for _, pl := range plugins {
		if pl.State != "running" && pl.State != "degraded" {
			if pl.State == "starting" || pl.State == "backoff" { // it will run: it may provide tasks
				pending = ps.unlisted(pending, pl.Name)
			}
			continue
		}
		specs, err := host.ListTasks(lctx, pl.Name)
		if err != nil {
			log.Warn("cannot list the tasks of a provider", "plugin", pl.Name, "error", err)
			pending = ps.unlisted(pending, pl.Name)
			continue
		}
		ps.listed[pl.Name] = true
		for _, spec := range specs {
			if owner, ok := known[spec.Name]; ok {
				if owner != pl.Name {
					log.Warn("two plugins provide the same task; keeping the first", "task", spec.Name, "kept", owner, "ignored", pl.Name)
				}
				continue
			}
			err := reg.Register(providedTask(runner, pl.Name, spec))
			switch {
			case errors.Is(err, worker.ErrDuplicateTask):
				log.Warn("a plugin provides a task whose name is taken by a built-in task; ignoring it", "task", spec.Name, "plugin", pl.Name)
			case err != nil:
				log.Warn("cannot register a provided task", "task", spec.Name, "plugin", pl.Name, "error", err)
			default:
				log.Info("registered a task from a plugin", "task", spec.Name, "plugin", pl.Name, "topic", spec.Topic)
			}
			known[spec.Name] = pl.Name
		}
	}
	return pending, true
}

// providerRetry is the least delay before retrying an attempt that failed
// because its provider plugin was not running.
const providerRetry = 20 * time.Second

// providedTask runs a task in its provider plugin through the host, on
// the provider's stream of attempts (runner), forwarding its log lines and
// progress to the attempt.
func providedTask(runner *capability.TaskRunner, plugin string, spec capability.TaskSpec) worker.Task {
	return worker.Task{
		Name:        spec.Name,
		Description: fmt.Sprintf("%s (provided by plugin %s)", spec.Description, plugin),
		Topic:       spec.Topic,
		MaxAttempts: providedAttempts(spec.MaxAttempts),
		Timeout:     spec.Timeout,
		// The attempt runs in the provider, whose capacity bounds it
		// (the pool's OffloadSlots are the runner's Capacity).
		Offload: true,
		Handler: func(ctx context.Context, tc *worker.TaskContext) (any, error) {
			res, err := runner.RunTask(ctx, plugin, capability.TaskRun{
				Task: spec.Name, Payload: tc.Payload, MessageID: strconv.FormatInt(tc.MessageID, 10), Attempt: tc.Attempt,
				Headers: tc.Headers,
			}, taskEvents{tc})
			var te *capability.TaskError
			switch {
			case err == nil:
				return json.RawMessage(res), nil
			case errors.As(err, &te):
				return nil, providedOutcome(te)
			case errors.Is(err, capability.ErrUnavailable), errors.Is(err, capability.ErrNotFound):
				// The host restarts a crashed plugin with a backoff of up
				// to a minute: spacing the retries gives it that time
				// rather than spending every attempt in a few seconds.
				return nil, worker.RetryAfter(fmt.Errorf("plugin %s, which provides %s, is not running (%w)", plugin, spec.Name, err), providerRetry)
			}
			return nil, fmt.Errorf("running %s in plugin %s: %w", spec.Name, plugin, err)
		},
	}
}

// providedAttempts is the attempts of a provided task whose spec asks
// for n: 3 when it names none (0), n up to what a submit may ask for.
// A negative n is kept, for the registry to refuse with its reason.
func providedAttempts(n int) int {
	if n == 0 {
		return 3
	}
	return min(n, broker.MaxAttempts)
}

// taskEvents forwards a provided task's events to its attempt.
type taskEvents struct{ tc *worker.TaskContext }

func (e taskEvents) Log(line string)    { e.tc.Logf("%s", line) }
func (e taskEvents) Progress(f float64) { e.tc.SetProgress(f) }
func (e taskEvents) LogsDropped(n int)  { e.tc.LogsDropped(n) }

// providedOutcome is the error a provided task's handler returns for its
// provider's TaskError: the outcome the task asked for (snooze, permanent
// failure, cancel) as the worker's, or an ordinary failure, the outcome of
// every plugin built before outcomes existed. The worker checks a
// snooze's delay.
func providedOutcome(te *capability.TaskError) error {
	switch te.Outcome {
	case capability.OutcomeSnooze:
		return worker.Snooze(te.Snooze)
	case capability.OutcomePermanent:
		return worker.Permanent(te)
	case capability.OutcomeCancel:
		return worker.CancelTask(te.Msg)
	}
	if te.RetryAfter > 0 {
		// Past the longest delay a message may wait, the retry waits
		// that long.
		return worker.RetryAfter(te, min(te.RetryAfter, broker.MaxDelay))
	}
	return te
}
