package tasksworker

// The fast paths of the orphan reclaim after a crash, without waiting for
// the reaper's full timeout: the certain one, for the workers of this
// plugin's earlier processes that the host saw end, and the pid one, for a
// neighbour worker on this machine whose process is gone.

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/reaper"
)

// recoverPredecessors takes back what earlier processes left: the certain
// path (reclaimEnded) for the workers of the instances the host saw end,
// and beside it the pid path (reclaimDeadNeighbours) for any other worker
// of this machine whose process is gone (a process of another host, or
// of this host before it restarted, which it cannot name).
func recoverPredecessors(ctx context.Context, b broker.Broker, rp *reaper.Reaper, self string, ended []string, grace, window time.Duration, log hclog.Logger) {
	var wg sync.WaitGroup
	named := reclaimEnded(ctx, b, rp, self, ended, grace, &wg, log)
	reclaimDeadNeighbours(ctx, b, rp, self, named, grace, window, log)
	wg.Wait()
}

// workerIDFor is the worker id of a pool of this process when the host
// gave it an instance id (capability.Instance):
// "<host>-<pid>-<instance>-<6 random hex digits>", so that the next
// process, told that this instance ended, finds this process's workers
// (ofInstance). Without an instance id it is "", and the pool names
// itself "<host>-<pid>-<6 random hex digits>".
func workerIDFor(instance string) string {
	if instance == "" {
		return ""
	}
	host, _ := os.Hostname()
	if host == "" {
		host = "unknown" // as the pool names its host
	}
	var r [3]byte
	_, _ = crand.Read(r[:]) // never fails (crypto/rand panics instead)
	return fmt.Sprintf("%s-%d-%s-%s", host, os.Getpid(), instance, hex.EncodeToString(r[:]))
}

// ofInstance reports whether w is a worker of the process of instance on
// this machine (host): its id is the one workerIDFor gave that process.
func ofInstance(w broker.WorkerInfo, host, instance string) bool {
	return instance != "" && w.Host == host && strings.HasPrefix(w.ID, fmt.Sprintf("%s-%d-%s-", w.Host, w.PID, instance))
}

// reclaimEnded is the certain path after a crash. The host is the
// plugin's parent: it waited on the processes it names in ended, so their
// workers are dead, which no heartbeat or pid lookup can say as surely
// (another PID namespace shares the host name, a silent worker may be
// frozen). Their work comes back at once (reaper.ReclaimDead): every
// claim, the youngest too, and every lock, before the worker is marked
// dead so that no pass meets its claims first.
//
// One exception waits: a worker that died holding a suspect (a message
// that had already lost a worker, see worker's isolation). That message
// may be what kills the process, and run again at once it would crash the
// plugin every few seconds, each crash within a minute of a start and so
// counted in the host's restart budget; its worker's work comes back
// once orphan_claim_grace_seconds have passed, as the reaper's passes
// would give it, the process having run that long by then. The wait runs
// in wg.
//
// It returns the workers it took, which the pid path leaves alone. A
// broker that cannot reclaim by worker (rabbitmq, whose connection's
// close brings the messages back, and memory) takes none.
func reclaimEnded(ctx context.Context, b broker.Broker, rp *reaper.Reaper, self string, ended []string, grace time.Duration, wg *sync.WaitGroup, log hclog.Logger) map[string]bool {
	if len(ended) == 0 {
		return nil
	}
	rec, ok := b.(broker.OrphanReclaimer)
	if _, can := b.(broker.DeadReclaimer); !ok || !can {
		return nil
	}
	host, err := os.Hostname()
	if err != nil {
		return nil
	}
	workers, err := b.Workers(ctx)
	if err != nil {
		log.Warn("cannot list the workers of this plugin's previous processes; the reaper reclaims their work", "error", err)
		return nil
	}
	named := map[string]bool{}
	var now, later []string
	for _, w := range workers {
		if w.ID == self || !slices.ContainsFunc(ended, func(inst string) bool { return ofInstance(w, host, inst) }) {
			continue
		}
		named[w.ID] = true
		if heldSuspect(ctx, b, w.ID) {
			later = append(later, w.ID)
		} else {
			now = append(now, w.ID)
		}
	}
	take := func(ids []string, msg string) {
		res, err := rp.ReclaimDead(ctx, ids)
		if err != nil {
			log.Warn("could not reclaim the work of this plugin's previous process; the reaper's passes will", "workers", fmt.Sprint(ids), "error", err)
			return
		}
		for _, id := range ids {
			if err := rec.ExpireWorker(ctx, id); err != nil && !errors.Is(err, broker.ErrNotFound) {
				log.Warn("cannot mark a dead worker", "worker", id, "error", err)
			}
		}
		if len(res.IDs)+res.LocksReleased > 0 {
			log.Warn(msg, "workers", fmt.Sprint(ids), "result", res.Summary())
		}
	}
	if len(now) > 0 {
		take(now, "reclaimed the work of this plugin's previous process, which the host saw exit")
	}
	if len(later) > 0 {
		log.Warn("this plugin's previous process died holding a message that had already lost a worker: it may be what kills the process, so that process's work is reclaimed once orphan_claim_grace_seconds have passed",
			"workers", fmt.Sprint(later), "grace", grace.String())
		wg.Go(func() {
			select {
			case <-ctx.Done():
				return
			case <-time.After(grace):
			}
			take(later, "reclaimed the work of this plugin's previous process, which the host saw exit, after the grace")
		})
	}
	return named
}

// heldSuspect reports whether worker holds a suspect (broker.Message's
// Suspect: it already lost a worker), or cannot be read, which counts as
// one.
func heldSuspect(ctx context.Context, b broker.Broker, worker string) bool {
	claims, err := b.RunningClaims(ctx, worker)
	if err != nil {
		return true
	}
	for _, c := range claims {
		m, err := b.GetMessage(ctx, c.ID)
		if err != nil {
			if errors.Is(err, broker.ErrNotFound) {
				continue
			}
			return true
		}
		if m.Suspect && m.State == broker.StateRunning && m.ClaimedBy == worker {
			return true
		}
	}
	return false
}

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

// reclaimDeadNeighbours is the pid path after a crash: workers registered
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
//
// Workers in skip (those the certain path took) are left out.
func reclaimDeadNeighbours(ctx context.Context, b broker.Broker, rp *reaper.Reaper, self string, skip map[string]bool, grace, window time.Duration, log hclog.Logger) {
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
			if w.ID != self && !skip[w.ID] && w.Host == host && pidGone(w.PID) {
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
