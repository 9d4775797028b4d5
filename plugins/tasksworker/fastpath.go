package tasksworker

import (
	"context"
	"errors"
	"os"
	"slices"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/reaper"
)

// pidGone reports whether no process with pid exists on this machine.
// A pid that exists but is not ours to signal (EPERM) is alive.
func pidGone(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return errors.Is(err, syscall.ESRCH)
}

// reclaimDeadNeighbours is the fast path after a crash: workers registered
// from this machine whose process no longer exists cannot come back, so
// they are marked dead and a pass runs, instead of waiting
// orphan_reclaim_after_seconds for their heartbeats to go stale. The
// reaper's guards still apply, including the grace: if claims younger than
// the grace were left, one more pass runs once the grace is over.
//
// A missing pid is not proof enough on its own: processes in other PID
// namespaces (containers given the same hostname, say) share the name and
// their pids are not seen here. So a worker is marked dead only once it
// has also missed two heartbeats (heartbeat is this process's interval,
// the one every worker is configured with): one that goes on heartbeating
// runs elsewhere and is left alone. A crashed worker has stopped, so this
// costs the fast path at most two heartbeat intervals.
func reclaimDeadNeighbours(ctx context.Context, b broker.Broker, rp *reaper.Reaper, self string, grace, heartbeat time.Duration, log hclog.Logger) {
	rec, ok := b.(broker.OrphanReclaimer)
	if !ok {
		return
	}
	host, err := os.Hostname()
	if err != nil {
		return
	}
	stale := 2 * heartbeat
	expired := 0
	waited := false
	for {
		workers, err := b.Workers(ctx)
		if err != nil {
			log.Warn("fast reclaim: cannot list workers", "error", err)
			return
		}
		live, err := rec.LiveWorkers(ctx, stale)
		if err != nil {
			log.Warn("fast reclaim: cannot read the live workers", "error", err)
			return
		}
		heartbeating := 0
		for _, w := range workers {
			if w.ID == self || w.Host != host || !pidGone(w.PID) {
				continue
			}
			if slices.Contains(live, w.ID) {
				if waited {
					log.Info("a worker with this machine's name and a pid not seen here goes on heartbeating: it runs elsewhere (another PID namespace); left to the reaper",
						"worker", w.ID, "pid", w.PID)
				}
				heartbeating++
				continue
			}
			if err := rec.ExpireWorker(ctx, w.ID); err != nil && !errors.Is(err, broker.ErrNotFound) {
				log.Warn("fast reclaim: cannot mark a dead worker", "worker", w.ID, "error", err)
				continue
			}
			log.Warn("previous worker on this machine is gone; reclaiming its work now", "worker", w.ID, "pid", w.PID)
			expired++
		}
		if heartbeating == 0 || waited {
			break
		}
		// Give the candidates time to miss two heartbeats, then look again.
		waited = true
		select {
		case <-ctx.Done():
			return
		case <-time.After(stale + heartbeat/2):
		}
	}
	if expired == 0 {
		return
	}
	res := rp.Pass(ctx)
	log.Info("fast reclaim pass", "result", res.Summary())
	if res.WithinGrace == 0 || res.Skipped != "" {
		return
	}
	select {
	case <-ctx.Done():
		return
	case <-time.After(grace + time.Second):
	}
	res = rp.Pass(ctx)
	log.Info("fast reclaim pass after the grace", "result", res.Summary())
}
