package sqlstore

import (
	"context"

	"github.com/taskhost/taskhost/broker"
)

// ReclaimOrphans does one reaper pass in one transaction; see
// broker.OrphanReclaimer. A reclaimed message's claim ends: the locks held
// under it are released (and counted) too, and its last error, starting
// with broker.OrphanedErrorPrefix, says who lost it. WithinGrace counts
// the orphan candidates (messages and locks) the grace kept.
//
// With req.Fence the pass is a leader-only write: it goes ahead only while
// Fence.Holder holds the lease at Fence.Term, unexpired
// (broker.ErrNotLeader otherwise, nothing changed).
//
// An empty req.Live is refused with broker.ErrInvalid (fail closed: the
// caller is alive, so an empty live set means the liveness signal is
// broken), as are a negative Grace or MaxAttempts. MaxAttempts 0 means no
// bound (always requeue).
func (s *Store) ReclaimOrphans(ctx context.Context, req broker.ReclaimRequest) (broker.ReclaimResult, error) {
	if len(req.Dead) > 0 {
		return broker.ReclaimResult{}, broker.Invalid("a reaper pass names no dead workers: reclaim those with ReclaimDead")
	}
	if len(req.Live) == 0 {
		return broker.ReclaimResult{}, broker.Invalid("the live-worker set is empty; reclaiming nothing (fail closed)")
	}
	if req.Grace < 0 {
		return broker.ReclaimResult{}, broker.Invalid("grace is negative")
	}
	if req.MaxAttempts < 0 {
		return broker.ReclaimResult{}, broker.Invalid("max attempts is negative")
	}
	return s.d.ReclaimOrphans(ctx, req)
}

// ReclaimDead reclaims, in one transaction, what the workers named in
// req.Dead left, whatever its age; see broker.DeadReclaimer. The dialect's
// ReclaimOrphans does it, told by req.Dead to touch only those workers'
// claims and locks (and the locks of the claims it ends). A request that
// names no worker, or also carries a live set or a grace, is refused with
// broker.ErrInvalid, as is a negative MaxAttempts.
func (s *Store) ReclaimDead(ctx context.Context, req broker.ReclaimRequest) (broker.ReclaimResult, error) {
	switch {
	case len(req.Dead) == 0:
		return broker.ReclaimResult{}, broker.Invalid("no dead worker named")
	case len(req.Live) > 0 || req.Grace != 0:
		return broker.ReclaimResult{}, broker.Invalid("a reclaim of dead workers takes no live set and no grace: they are for workers that only look dead")
	case req.MaxAttempts < 0:
		return broker.ReclaimResult{}, broker.Invalid("max attempts is negative")
	}
	return s.d.ReclaimOrphans(ctx, req)
}
