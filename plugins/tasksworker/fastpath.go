package tasksworker

// The fast path of the orphan reclaim: a neighbour worker on this machine
// whose process is gone has its work reclaimed without waiting for the
// reaper's full timeout.

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

// fastReclaimWindow is how long a neighbour must stay silent before the
// fast path takes its work: three heartbeats, at least 30 seconds (so a
// live sibling that is late for a while, through a database blip or a
// long pause, is not taken for dead), never longer than the reaper's own
// threshold (after).
func fastReclaimWindow(heartbeat, after time.Duration) time.Duration {
	return min(max(3*heartbeat, 30*time.Second), after)
}

// reclaimDeadNeighbours is the fast path after a crash: workers registered
// from this machine whose process no longer exists cannot come back, so
// they are marked dead and a pass runs, instead of waiting for the beat's
// next pass (orphan_reclaim_interval_seconds) and for their heartbeats to
// be orphan_reclaim_after_seconds old. The reaper's guards still apply,
// including the grace, which the pass waits out for the dead workers'
// claims (all older than the first look); if another worker's claims
// younger than the grace were left, one more pass runs once it is over.
//
// A missing pid is not proof enough on its own: processes in other PID
// namespaces (containers given the same hostname, say) share the name and
// their pids are not seen here. So the candidates are looked at twice,
// window apart, and a worker is marked dead only if it did not heartbeat
// at all in between: one that heartbeats runs elsewhere and is left to the
// reaper. A crashed worker has stopped, so this costs the fast path one
// window.
func reclaimDeadNeighbours(ctx context.Context, b broker.Broker, rp *reaper.Reaper, self string, grace, window time.Duration, log hclog.Logger) {
	rec, ok := b.(broker.OrphanReclaimer)
	if !ok {
		return
	}
	host, err := os.Hostname()
	if err != nil {
		return
	}
	// candidates are the workers of this machine's name, other than this
	// one, whose pid does not exist here.
	candidates := func() (map[string]broker.WorkerInfo, bool) {
		workers, err := b.Workers(ctx)
		if err != nil {
			log.Warn("fast reclaim: cannot list workers", "error", err)
			return nil, false
		}
		out := map[string]broker.WorkerInfo{}
		for _, w := range workers {
			if w.ID != self && w.Host == host && pidGone(w.PID) {
				out[w.ID] = w
			}
		}
		return out, true
	}
	first, ok := candidates()
	if !ok || len(first) == 0 {
		return
	}
	// The candidates' processes were gone by now, so every claim and lock
	// a dead one left is older than this.
	looked := time.Now()
	select {
	case <-ctx.Done():
		return
	case <-time.After(window):
	}
	second, ok := candidates()
	if !ok {
		return
	}
	live, err := rec.LiveWorkers(ctx, window)
	if err != nil {
		log.Warn("fast reclaim: cannot read the live workers", "error", err)
		return
	}
	expired := 0
	for id, w := range second {
		if was, seen := first[id]; !seen || was.PID != w.PID {
			continue
		}
		if slices.Contains(live, id) {
			log.Info("a worker with this machine's name and a pid not seen here goes on heartbeating: it runs elsewhere (another PID namespace); left to the reaper",
				"worker", id, "pid", w.PID)
			continue
		}
		if err := rec.ExpireWorker(ctx, id); err != nil && !errors.Is(err, broker.ErrNotFound) {
			log.Warn("fast reclaim: cannot mark a dead worker", "worker", id, "error", err)
			continue
		}
		log.Warn("previous worker on this machine is gone; reclaiming its work now", "worker", id, "pid", w.PID,
			"silent_for_at_least", window.String())
		expired++
	}
	if expired == 0 {
		return
	}
	// Pass only once the dead workers' claims are past the grace: a pass
	// that met them younger would be refused by the grace guard and count
	// a skip, as if the reaper were failing closed, for a plain crash.
	if wait := time.Until(looked.Add(grace + time.Second)); grace > 0 && wait > 0 {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
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
