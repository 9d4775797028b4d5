package scheduler

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/reaper"
)

// Beat is the work the leader does: it drives the reaper every interval.
type Beat struct {
	Reaper   *reaper.Reaper
	Settings reaper.Settings
	Logger   hclog.Logger
	// OnPass, if set, sees every pass's result (tests, the admin UI).
	OnPass func(reaper.Result)
}

// Run runs the beat for one term until ctx is done. The first pass runs at
// once: the caller starts the beat only after this process's own first
// heartbeat is written, so a plain deploy does not trip the caller guard.
func (b *Beat) Run(ctx context.Context, fence broker.Fence) {
	log := b.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	if !b.Settings.Enabled || b.Reaper == nil {
		log.Info("orphan reaper disabled (orphan_reclaim_enabled: false): dead workers' messages will not be reclaimed")
		<-ctx.Done()
		return
	}
	t := time.NewTicker(b.Settings.Interval)
	defer t.Stop()
	for {
		res := b.Reaper.PassAsLeader(ctx, fence)
		if b.OnPass != nil && ctx.Err() == nil {
			b.OnPass(res)
		}
		if res.NotLeader {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
