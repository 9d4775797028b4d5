package scheduler

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/reaper"
)

// Bounds of the beat's database work, so that a connection that hangs
// (a half-open TCP connection can take the kernel a quarter of an hour to
// give up) stops one round of it, logged and counted as failed, rather
// than the beat.
const (
	tickTimeout  = 30 * time.Second
	passTimeout  = time.Minute
	purgeTimeout = 10 * time.Minute
)

// Beat is the work the leader does: it fires due schedules every tick and
// drives the reaper every reaper interval.
type Beat struct {
	Reaper   *reaper.Reaper
	Settings reaper.Settings
	// Schedules, if set, fires due schedules every TickEvery (default 1s).
	Schedules *Ticker
	TickEvery time.Duration
	// Purge, if set, runs once per term start and then hourly: it drops
	// old task reports and old finished messages.
	Purge  func(ctx context.Context)
	Logger hclog.Logger
	// OnPass, if set, sees every reaper pass's result (tests).
	OnPass func(reaper.Result)
}

// Run runs the beat for one term until ctx is done or the lease is lost.
// The caller starts the beat only after this process's own first
// heartbeat is written, so the first reaper pass, which runs at once,
// does not trip the caller guard on a plain deploy.
func (b *Beat) Run(ctx context.Context, fence broker.Fence) {
	log := b.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	if b.Schedules != nil {
		wg.Go(func() { b.tickLoop(ctx, fence, cancel, log) })
	}
	if b.Purge != nil {
		wg.Go(func() {
			every(ctx, time.Hour, func() bool {
				pctx, pcancel := context.WithTimeout(ctx, purgeTimeout)
				defer pcancel()
				b.Purge(pctx)
				return true
			})
		})
	}
	if b.Settings.Enabled && b.Reaper != nil {
		wg.Go(func() { b.reaperLoop(ctx, fence, cancel) })
	} else {
		log.Warn("orphan reaper disabled (orphan_reclaim_enabled: false): dead workers' messages will not be reclaimed")
	}
	wg.Wait()
}

func (b *Beat) reaperLoop(ctx context.Context, fence broker.Fence, lost context.CancelFunc) {
	every(ctx, b.Settings.Interval, func() bool {
		pctx, pcancel := context.WithTimeout(ctx, passTimeout)
		res := b.Reaper.PassAsLeader(pctx, fence)
		pcancel()
		if b.OnPass != nil && ctx.Err() == nil {
			b.OnPass(res)
		}
		if res.NotLeader {
			lost()
			return false
		}
		return true
	})
}

func (b *Beat) tickLoop(ctx context.Context, fence broker.Fence, lost context.CancelFunc, log hclog.Logger) {
	d := b.TickEvery
	if d <= 0 {
		d = time.Second
	}
	every(ctx, d, func() bool {
		tctx, tcancel := context.WithTimeout(ctx, tickTimeout)
		err := b.Schedules.pass(tctx, fence, gapFor(d))
		tcancel()
		switch {
		case errors.Is(err, broker.ErrNotLeader):
			log.Warn("schedule tick refused: this process no longer leads")
			lost()
			return false
		case err != nil && ctx.Err() == nil:
			log.Error("schedule tick failed", "error", err)
		}
		return true
	})
}

// every runs f at once and then every d until ctx is done or f says stop.
func every(ctx context.Context, d time.Duration, f func() bool) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		if !f() {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
