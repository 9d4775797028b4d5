package tasksworker

// The Plugin type and its capabilities: Describe, CheckConfig, Configure
// (which starts a runtime, runtime.go) and Stop, health, metrics and the
// HTTP handler (the API and the UI). The actions are in actions.go.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/reaper"
	"github.com/taskhost/taskhost/scheduler"
	"github.com/taskhost/taskhost/worker"
)

// Name is the plugin's name: its config key, URL segment and metric prefix.
const Name = "tasks_worker"

// Version is the plugin's version.
const Version = "0.1.0"

// Plugin is the tasks_worker plugin. Create it with New and hand it to
// capability.Serve.
type Plugin struct {
	log     hclog.Logger
	router  chi.Router
	metrics *telemetry
	// reaperMetrics are the reaper counters, registered once per process.
	reaperMetrics *reaper.Metrics
	// providerMetrics are the series of the plugin boundary.
	providerMetrics *providerMetrics

	// ownTasks register the tasks linked into this binary (WithTasks),
	// in order, beside the built-in ones, at each start.
	ownTasks []func(*worker.Registry) error

	// life serialises Configure and Stop; mu guards rt, which the HTTP
	// handlers, actions and metrics read.
	life sync.Mutex
	mu   sync.RWMutex
	rt   *runtime
}

var (
	_ capability.Lifecycle       = (*Plugin)(nil)
	_ capability.MetricsProvider = (*Plugin)(nil)
	_ capability.HTTPHandler     = (*Plugin)(nil)
	_ capability.ActionProvider  = (*Plugin)(nil)
)

// An Option changes the plugin New returns.
type Option func(*Plugin)

// WithTasks registers a program's own tasks in the plugin, beside the
// built-in ones: register is called with the registry of each start
// (each Configure), before the worker pool starts, and its error fails
// that start. Tasks registered so run in the tasks_worker process, as the
// built-in ones do, with no plugin boundary to cross: build the program
// as fp-plugin-tasks_worker (see package program). A name taken by a
// built-in task, or registered twice, is an error (worker.ErrDuplicateTask);
// a provider plugin's task of the same name is then ignored, with a
// warning.
func WithTasks(register func(*worker.Registry) error) Option {
	return func(p *Plugin) { p.ownTasks = append(p.ownTasks, register) }
}

// New returns an unconfigured plugin that logs to logger.
func New(logger hclog.Logger, opts ...Option) *Plugin {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	p := &Plugin{log: logger}
	for _, o := range opts {
		o(p)
	}
	p.metrics = newTelemetry(p.stats, p.lastHeartbeat, p.missing, logger)
	p.reaperMetrics = reaper.NewMetrics(p.metrics.reg)
	p.providerMetrics = newProviderMetrics(p.metrics.reg, func() int {
		if rt := p.current(); rt != nil {
			return rt.pool.Overrunning()
		}
		return 0
	})
	p.reaperMetrics.Cancelled = p.metrics.cancelled // orphans whose cancel was requested
	p.metrics.reg.MustRegister(&scheduler.HealthCollector{
		Store: func() broker.ScheduleStore {
			if rt := p.current(); rt != nil {
				return rt.broker
			}
			return nil
		},
		Waiting: func(s broker.Schedule) bool {
			rt := p.current()
			return rt != nil && rt.svc.ScheduleWaiting(s) != nil
		},
		Logger: logger.Named("schedules"),
	})
	p.router = p.routes()
	return p
}

// current returns the running runtime, or nil.
func (p *Plugin) current() *runtime {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.rt
}

func (p *Plugin) swap(rt *runtime) *runtime {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.rt
	p.rt = rt
	return old
}

// stats reads the current broker's stats; ok is false when there is no
// broker.
func (p *Plugin) stats(ctx context.Context) (broker.Stats, bool, error) {
	rt := p.current()
	if rt == nil {
		return broker.Stats{}, false, nil
	}
	st, err := rt.broker.Stats(ctx)
	return st, true, err
}

// missing is how many queued messages the current broker's topic queues
// lacked at its last looks (the rabbitmq broker's Missing); 0 on the
// other brokers, whose queue is the store.
func (p *Plugin) missing() int {
	if rt := p.current(); rt != nil {
		if m, ok := rt.broker.(interface{ Missing() int }); ok {
			return m.Missing()
		}
	}
	return 0
}

// Describe implements capability.Lifecycle.
func (p *Plugin) Describe(context.Context) (capability.Description, error) {
	return capability.Description{
		Name:         Name,
		Version:      Version,
		APIVersions:  []int{capability.ProtocolVersion},
		Capabilities: capability.CapabilitiesOf(p),
	}, nil
}

var _ capability.ConfigChecker = (*Plugin)(nil)

// CheckConfig implements capability.ConfigChecker: every check of the
// config block that needs neither the broker nor the task registry (a
// schedule's task need not be registered: a schedule of a task no worker
// runs waits for one; its topic is checked when the plugin starts).
func (p *Plugin) CheckConfig(raw json.RawMessage) error {
	cfg, err := ParseConfig(raw)
	if err != nil {
		return err
	}
	for i, b := range cfg.Schedules {
		if _, err := b.Check(cfg.MaxPayloadBytes); err != nil {
			return invalid(fmt.Sprintf("schedules[%d]", i), "%v", err)
		}
	}
	return nil
}

// Configure implements capability.Lifecycle: it parses the config, stops
// what a previous Configure started, opens the broker, registers the
// built-in tasks and starts the worker pool.
func (p *Plugin) Configure(ctx context.Context, req capability.ConfigureRequest) error {
	p.life.Lock()
	defer p.life.Unlock()

	if lvl := hclog.LevelFromString(req.LogLevel); lvl != hclog.NoLevel {
		p.log.SetLevel(lvl)
	}
	cfg, err := ParseConfig(req.Config)
	if err != nil {
		return err
	}
	open, err := openBroker(cfg, p.log, p.metrics)
	if err != nil {
		return err
	}
	if old := p.swap(nil); old != nil {
		p.log.Info("configured again: stopping the previous worker pool and broker")
		if err := old.stop(ctx, p.log); err != nil {
			p.log.Warn("stopping the previous runtime", "error", err)
		}
	}

	b, err := open(ctx)
	if err != nil {
		return fmt.Errorf("open the %s broker: %w", cfg.Broker, err)
	}
	rt, err := p.start(ctx, cfg, b, req.Host)
	if err != nil {
		_ = b.Close()
		return err
	}
	p.swap(rt)
	p.log.Info("tasks_worker configured", "broker", cfg.Broker, "workers", cfg.Workers,
		"worker_id", rt.pool.WorkerID(), "topics", rt.pool.Topics())
	return nil
}

// CheckHealth implements capability.Lifecycle.
func (p *Plugin) CheckHealth(ctx context.Context) (capability.Health, error) {
	rt := p.current()
	if rt == nil {
		return capability.Health{Status: capability.HealthError, Message: "not running: not configured yet, or stopped"}, nil
	}
	// The live workers, not Stats: a health check runs every few seconds
	// and must cost the same whatever the queue holds.
	workers, err := rt.svc.LiveWorkerCount(ctx)
	if err != nil {
		return capability.Health{Status: capability.HealthError, Message: fmt.Sprintf("the %s broker does not answer: %v", rt.broker.Kind(), err)}, nil
	}
	if err := rt.connectionProblem(); err != nil {
		return capability.Health{Status: capability.HealthDegraded, Message: disconnectedMessage(rt.broker.Kind(), err)}, nil
	}
	if at, err := rt.pool.LastHeartbeat(); err != nil {
		// Reads can go on while writes fail (a full disk, a read-only
		// replica): the heartbeat is this worker's write that always runs.
		return capability.Health{Status: capability.HealthDegraded, Message: fmt.Sprintf(
			"the %s broker refuses this worker's heartbeat (last stamped %s ago): %v; outcomes may not be stored, and other workers take this one for dead after %s",
			rt.broker.Kind(), time.Since(at).Round(time.Second), err, rt.cfg.Reaper.After)}, nil
	}
	return capability.Health{
		Status: capability.HealthOK,
		Message: fmt.Sprintf("%s broker; %d live worker(s); %d/%d tasks running here",
			rt.broker.Kind(), workers, rt.pool.Running(), rt.pool.Concurrency()),
	}, nil
}

// lastHeartbeat is when the running worker last stamped its heartbeat;
// false while none runs.
func (p *Plugin) lastHeartbeat() (time.Time, bool) {
	rt := p.current()
	if rt == nil || rt.pool == nil {
		return time.Time{}, false
	}
	at, _ := rt.pool.LastHeartbeat()
	return at, !at.IsZero()
}

// Stop implements capability.Lifecycle: it drains the pool within ctx and
// closes the broker. Stopping twice, or before Configure, is harmless.
func (p *Plugin) Stop(ctx context.Context) error {
	p.life.Lock()
	defer p.life.Unlock()
	rt := p.swap(nil)
	if rt == nil {
		return nil
	}
	p.log.Info("stopping: draining the worker pool")
	return rt.stop(ctx, p.log)
}

// CollectMetrics implements capability.MetricsProvider.
func (p *Plugin) CollectMetrics(context.Context) (capability.MetricsPayload, error) {
	body, format, err := p.metrics.exposition(p.log)
	if err != nil {
		return capability.MetricsPayload{}, err
	}
	return capability.MetricsPayload{Body: body, Format: format}, nil
}

// ServeHTTP implements capability.HTTPHandler.
func (p *Plugin) ServeHTTP(w http.ResponseWriter, r *http.Request) { p.router.ServeHTTP(w, r) }
