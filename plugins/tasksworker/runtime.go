package tasksworker

// The runtime one Configure starts: the broker, the worker pool, the
// reaper, the beat and the service over them, and how it stops.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/plugins/tasksworker/service"
	"github.com/taskhost/taskhost/reaper"
	"github.com/taskhost/taskhost/scheduler"
	"github.com/taskhost/taskhost/worker"
)

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
	// runner runs the attempts of provided tasks in their plugins (nil
	// without a host).
	runner *capability.TaskRunner
	// cancel stops the runtime's own goroutines; wg waits for them.
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (p *Plugin) start(ctx context.Context, cfg Config, b leasingBroker, host capability.HostServices) (*runtime, error) {
	reg := worker.NewRegistry()
	// The watchdog task runs the same pass as the beat and the admin
	// action; the reaper needs the pool's worker id, so it is bound below,
	// before any task can run.
	var rp *reaper.Reaper
	reclaim := func(ctx context.Context) reaper.Result { return rp.Pass(ctx) }
	if err := registerBuiltins(reg, cfg, reclaim); err != nil {
		return nil, fmt.Errorf("register built-in tasks: %w", err)
	}
	for _, register := range p.ownTasks {
		if err := register(reg); err != nil {
			return nil, fmt.Errorf("register the program's own tasks (tasksworker.WithTasks): %w", err)
		}
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
	if cfg.Beat {
		roles = append(roles, broker.RoleBeat)
	}
	// The attempts of provided tasks run in their plugins, as many at
	// once as each plugin takes, besides the workers.
	var runner *capability.TaskRunner
	var offloadSlots func() int
	if host != nil {
		runner = capability.NewTaskRunner(host, capability.TaskRunnerOptions{
			Logger:  p.log.Named("providers"),
			Refused: p.providerMetrics.Refused,
			Dropped: p.providerMetrics.Dropped,
		})
		offloadSlots = runner.Capacity
	}
	pool := worker.NewPool(b, reg, worker.Options{
		WorkerID:          workerIDFor(capability.Instance()),
		Roles:             roles,
		Topics:            topics,
		Concurrency:       cfg.Workers,
		OffloadSlots:      offloadSlots,
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
		if runner != nil {
			runner.Close()
		}
		return nil, err
	}
	svc := p.newService(cfg, b, reg, pool, rp)
	providers := newProviderSet(host, runner, reg, p.log.Named("providers"), unknownTaskGrace)
	svc.SetPendingProviders(providers.Pending)
	rt := &runtime{cfg: cfg, broker: b, reg: reg, pool: pool, reaper: rp, reports: reports, svc: svc, runner: runner}
	if err := applyConfigSchedules(ctx, svc, cfg.Schedules); err != nil {
		_ = pool.Stop(ctx)
		if runner != nil {
			runner.Close()
		}
		reports.Close(closeWithin(ctx))
		return nil, err
	}
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	rt.cancel = cancel
	rt.wg.Go(func() { watchProviders(bg, providers) })
	if cfg.Reaper.Enabled {
		rt.wg.Go(func() {
			recoverPredecessors(bg, b, rp, pool.WorkerID(), capability.EndedInstances(), cfg.Reaper.Grace,
				fastReclaimWindow(cfg.HeartbeatInterval, cfg.Reaper.After), p.log.Named("reaper"))
		})
	}
	if cfg.Beat {
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
		rt.leader = scheduler.NewLeader(b, scheduler.LeaderOptions{
			Holder:    pool.WorkerID(),
			TTL:       cfg.BeatLeaseTTL,
			OnElected: beat.Run,
			Logger:    p.log.Named("leader"),
		})
		svc.SetLeader(rt.leader)
		rt.leader.Start(ctx)
	}
	return rt, nil
}

// newService is the task system's operations over one runtime's parts.
func (p *Plugin) newService(cfg Config, b broker.Broker, reg *worker.Registry, pool *worker.Pool, rp *reaper.Reaper) *service.Service {
	deps := service.Deps{
		Broker: b, Tasks: serviceTasks{reg}, Pool: pool, Fleet: pool.Fleet(), Reaper: rp, Submitted: p.metrics.Submitted, Cancelled: p.metrics.Cancelled,
		Settings: service.Settings{
			MaxPayloadBytes: cfg.MaxPayloadBytes, Beat: cfg.Beat, HeartbeatInterval: cfg.HeartbeatInterval, Reaper: cfg.Reaper,
		},
		// A running task's cancel stops it at once when this process's
		// pool runs it; other processes' pools learn of it from the broker.
		OnCancelRequested: func(id int64) { pool.CancelRunning(id) },
	}
	return service.New(deps)
}

// serviceTasks is the registry as the service reads it (service.Tasks):
// each task as the service's TaskInfo, which holds what the service and
// the UI show of a task, so that neither links package worker.
type serviceTasks struct{ *worker.Registry }

// Lookup is the task registered under name.
func (r serviceTasks) Lookup(name string) (service.TaskInfo, bool) {
	t, ok := r.Registry.Lookup(name)
	return service.TaskInfo{Name: t.Name, Description: t.Description, Topic: t.Topic, MaxAttempts: t.MaxAttempts}, ok
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
	if rt.runner != nil {
		// After the pool's drain: the attempts it ran in plugins have
		// ended or been given up.
		rt.runner.Close()
	}
	rt.reports.Close(closeWithin(ctx))
	if cerr := rt.broker.Close(); cerr != nil {
		log.Warn("closing the broker", "error", cerr)
	}
	return err
}

// connectionHealth is implemented by a broker whose messages travel over a
// connection of their own beside its store (rabbitmq): nil while it is
// connected, else what is wrong while it reconnects.
type connectionHealth interface{ Health() error }

// connectionProblem is why the broker's connection is down, or nil (also
// for brokers that have none).
func (rt *runtime) connectionProblem() error {
	if h, ok := rt.broker.(connectionHealth); ok {
		return h.Health()
	}
	return nil
}

// disconnectedMessage says what a broker's lost connection means for a
// person reading the health.
func disconnectedMessage(kind string, err error) string {
	return fmt.Sprintf("the %s broker is not connected: %v; tasks are not delivered meanwhile, and it reconnects on its own", kind, err)
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
