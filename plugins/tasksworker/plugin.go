package tasksworker

// The Plugin type: its lifecycle (Configure starts a runtime: broker,
// worker pool, reaper, beat and the service over them; Stop drains it),
// health, metrics, the HTTP handler and the reclaim action.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/plugins/tasksworker/service"
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

	// life serialises Configure and Stop; mu guards rt, which the HTTP
	// handlers, actions and metrics read.
	life sync.Mutex
	mu   sync.RWMutex
	rt   *runtime
}

// runtime is what one Configure starts and Stop (or the next Configure)
// stops.
type runtime struct {
	cfg    Config
	broker broker.Broker
	reg    *worker.Registry
	pool   *worker.Pool
	reaper *reaper.Reaper
	leader *scheduler.Leader // nil when this process is no beat candidate
	// reports stores task reports off the workers' path.
	reports *worker.ReportWriter
	// svc is the task system's operations over the above: the API, the
	// UI, the config's schedules, the beat and the actions use it.
	svc *service.Service
	// cancel stops the runtime's own goroutines; wg waits for them.
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

var (
	_ capability.Lifecycle       = (*Plugin)(nil)
	_ capability.MetricsProvider = (*Plugin)(nil)
	_ capability.HTTPHandler     = (*Plugin)(nil)
	_ capability.ActionProvider  = (*Plugin)(nil)
)

// New returns an unconfigured plugin that logs to logger.
func New(logger hclog.Logger) *Plugin {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	p := &Plugin{log: logger}
	p.metrics = newTelemetry(p.stats, p.lastHeartbeat, logger)
	p.reaperMetrics = reaper.NewMetrics(p.metrics.reg)
	p.metrics.reg.MustRegister(&scheduler.HealthCollector{
		Store: func() broker.ScheduleStore {
			if rt := p.current(); rt != nil {
				return rt.broker
			}
			return nil
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
// schedule's task and topic are checked when the plugin starts).
func (p *Plugin) CheckConfig(raw json.RawMessage) error {
	cfg, err := ParseConfig(raw)
	if err != nil {
		return err
	}
	for i, b := range cfg.Schedules {
		if _, err := b.Check(); err != nil {
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
	open, err := openBroker(cfg, p.log)
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

func (p *Plugin) start(ctx context.Context, cfg Config, b broker.Broker, host capability.HostServices) (*runtime, error) {
	reg := worker.NewRegistry()
	// The watchdog task runs the same pass as the beat and the admin
	// action; the reaper needs the pool's worker id, so it is bound below,
	// before any task can run.
	var rp *reaper.Reaper
	reclaim := func(ctx context.Context) reaper.Result { return rp.Pass(ctx) }
	if err := registerBuiltins(reg, cfg, reclaim); err != nil {
		return nil, fmt.Errorf("register built-in tasks: %w", err)
	}
	if err := applyTopics(ctx, b, cfg.Topics, p.log); err != nil {
		return nil, err
	}
	topics := sortedKeys(cfg.Topics)
	drain := cfg.DrainTimeout
	if drain == 0 {
		drain = -1 // the pool's "cancel at once"
	}
	reports := worker.NewReportWriter(b, p.log.Named("reports"), func(n int) { p.metrics.reportsDropped.Add(float64(n)) })
	roles := []string{broker.RoleWorker}
	leaser, canLead := b.(broker.Leaser)
	if cfg.Beat && canLead {
		roles = append(roles, broker.RoleBeat)
	}
	pool := worker.NewPool(b, reg, worker.Options{
		Roles:             roles,
		Topics:            topics,
		Concurrency:       cfg.Workers,
		HeartbeatInterval: cfg.HeartbeatInterval,
		DrainTimeout:      drain,
		Logger:            p.log.Named("pool"),
		Observer:          p.metrics,
		Reporter:          reports,
		Strays:            func(n int) { p.metrics.straysRequeued.Add(float64(n)) },
		UnknownTaskGrace:  unknownTaskGrace,
		UnknownTaskWait:   unknownTaskWait,
	})
	// Every topic this process claims exists in the broker from the start,
	// so its gauges are there (at zero) before the first submit.
	for _, name := range pool.Topics() {
		if _, ok := cfg.Topics[name]; ok {
			continue
		}
		if _, err := b.SetTopic(ctx, name, broker.TopicPatch{}); err != nil {
			return nil, fmt.Errorf("create topic %q: %w", name, err)
		}
	}
	rp = reaper.New(b, pool.WorkerID(), cfg.Reaper, p.log.Named("reaper"), p.reaperMetrics)
	// Start registers the worker and writes its first heartbeat before it
	// returns; the beat starts after that, so its first pass never finds
	// its own process missing from the live set.
	if err := pool.Start(ctx); err != nil {
		return nil, err
	}
	svc := p.newService(cfg, b, reg, pool, rp)
	rt := &runtime{cfg: cfg, broker: b, reg: reg, pool: pool, reaper: rp, reports: reports, svc: svc}
	if err := applyConfigSchedules(ctx, svc, cfg.Schedules); err != nil {
		_ = pool.Stop(ctx)
		reports.Close(closeWithin(ctx))
		return nil, err
	}
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	rt.cancel = cancel
	rt.wg.Go(func() { watchProviders(bg, host, reg, p.log.Named("providers")) })
	if cfg.Reaper.Enabled {
		rt.wg.Go(func() {
			reclaimDeadNeighbours(bg, b, rp, pool.WorkerID(), cfg.Reaper.Grace,
				fastReclaimWindow(cfg.HeartbeatInterval, cfg.Reaper.After), p.log.Named("reaper"))
		})
	}
	if cfg.Beat && canLead {
		beat := &scheduler.Beat{
			Reaper: rp, Settings: cfg.Reaper, Logger: p.log.Named("beat"),
			Schedules: &scheduler.Ticker{
				Store:     b,
				Lookup:    svc.ScheduleLookup,
				Logger:    p.log.Named("schedules"),
				Submitted: p.metrics.Submitted,
			},
			TickEvery: cfg.BeatTick,
			Purge: func(ctx context.Context) {
				n, err := b.PurgeReports(ctx, time.Now().Add(-cfg.ReportRetention))
				if err != nil {
					p.log.Warn("purging old task reports failed", "error", err)
				} else if n > 0 {
					p.log.Info("purged old task reports", "count", n, "retention", cfg.ReportRetention.String())
				}
				if fp, ok := b.(broker.FinishedPurger); ok && cfg.MessageRetention > 0 {
					n, err := fp.PurgeFinished(ctx, time.Now().Add(-cfg.MessageRetention))
					if err != nil {
						p.log.Warn("purging old done messages failed", "purged", n, "error", err)
					} else if n > 0 {
						p.log.Info("purged old done messages", "count", n, "retention", cfg.MessageRetention.String())
					}
				}
			},
		}
		rt.leader = scheduler.NewLeader(leaser, scheduler.LeaderOptions{
			Holder:    pool.WorkerID(),
			TTL:       cfg.BeatLeaseTTL,
			OnElected: beat.Run,
			Logger:    p.log.Named("leader"),
		})
		svc.SetLeader(rt.leader)
		rt.leader.Start(ctx)
	} else if cfg.Beat {
		p.log.Warn("this broker cannot elect a beat leader; no beat runs", "broker", b.Kind())
	}
	return rt, nil
}

// newService is the task system's operations over one runtime's parts.
func (p *Plugin) newService(cfg Config, b broker.Broker, reg *worker.Registry, pool *worker.Pool, rp *reaper.Reaper) *service.Service {
	return service.New(service.Deps{
		Broker: b, Tasks: reg, Pool: pool, Reaper: rp, Submitted: p.metrics.Submitted,
		Settings: service.Settings{
			MaxPayloadBytes: cfg.MaxPayloadBytes, Beat: cfg.Beat, HeartbeatInterval: cfg.HeartbeatInterval, Reaper: cfg.Reaper,
		},
	})
}

// applyConfigSchedules upserts the schedules the config declares.
func applyConfigSchedules(ctx context.Context, svc *service.Service, specs []service.ScheduleSpec) error {
	err := svc.ApplySchedules(ctx, specs)
	var bad *service.SpecError
	if errors.As(err, &bad) {
		return invalid(fmt.Sprintf("schedules[%d]", bad.Index), "%v", bad.Err)
	}
	return err
}

func (rt *runtime) stop(ctx context.Context, log hclog.Logger) error {
	rt.cancel()
	rt.wg.Wait()
	if rt.leader != nil {
		// Hand the beat over first, so a standby leads while this
		// process drains.
		rt.leader.Stop(ctx)
	}
	err := rt.pool.Stop(ctx)
	rt.reports.Close(closeWithin(ctx))
	if cerr := rt.broker.Close(); cerr != nil {
		log.Warn("closing the broker", "error", cerr)
	}
	return err
}

// closeWithin is the context for storing the last task reports at stop:
// what is left of ctx's deadline, at least a second, and ten seconds when
// ctx has none. The pool's Stop may have used ctx up; reports still get a
// moment.
func closeWithin(ctx context.Context) context.Context {
	d := 10 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		d = max(time.Until(dl), time.Second)
	}
	c, cancel := context.WithTimeout(context.WithoutCancel(ctx), d)
	context.AfterFunc(c, cancel)
	return c
}

// CheckHealth implements capability.Lifecycle.
func (p *Plugin) CheckHealth(ctx context.Context) (capability.Health, error) {
	rt := p.current()
	if rt == nil {
		return capability.Health{Status: capability.HealthError, Message: "not running: not configured yet, or stopped"}, nil
	}
	st, err := rt.broker.Stats(ctx)
	if err != nil {
		return capability.Health{Status: capability.HealthError, Message: fmt.Sprintf("the %s broker does not answer: %v", rt.broker.Kind(), err)}, nil
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
			rt.broker.Kind(), st.Workers, rt.pool.Running(), rt.pool.Concurrency()),
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

// ActionReclaim is the id of the "reclaim orphaned messages now" action.
const ActionReclaim = "reclaim_orphaned_messages"

// ListActions implements capability.ActionProvider.
func (p *Plugin) ListActions(context.Context) ([]capability.ActionSpec, error) {
	return []capability.ActionSpec{{
		ID:    ActionReclaim,
		Title: "Reclaim orphaned messages now",
		Description: "Runs one orphan-reclaim pass: running messages whose worker stopped heartbeating are requeued " +
			"(or dead-lettered past their attempt limit) and the locks such workers held are released. " +
			"It fails closed: when the live-worker set cannot be trusted it changes nothing.",
		Confirm:        true,
		TimeoutSeconds: 30,
	}}, nil
}

// InvokeAction implements capability.ActionProvider. The reclaim action
// calls the reaper's pass directly, not through the queue, so it works
// while a topic is wedged.
func (p *Plugin) InvokeAction(ctx context.Context, req capability.ActionRequest) (capability.ActionResult, error) {
	if req.ActionID != ActionReclaim {
		return capability.ActionResult{}, fmt.Errorf("action %q (tasks_worker has %s): %w", req.ActionID, ActionReclaim, capability.ErrNotFound)
	}
	rt := p.current()
	if rt == nil {
		return capability.ActionResult{}, fmt.Errorf("tasks_worker is not running: %w", capability.ErrUnavailable)
	}
	res := rt.svc.Reclaim(ctx)
	body, err := json.Marshal(res)
	if err != nil {
		return capability.ActionResult{}, err
	}
	p.log.Info("reclaim pass requested by an operator", "actor", req.Actor, "result", res.Summary())
	return capability.ActionResult{Message: res.Summary(), Result: body}, nil
}
