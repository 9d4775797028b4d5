package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// run runs the three main phases once.
func (bn *bench) run(ctx context.Context, run int) (benchResult, error) {
	cfg := bn.cfg
	r := benchResult{Run: run}
	if err := bn.reset(ctx); err != nil {
		return r, err
	}

	// Bulk submit.
	topic := bn.topic("burn", run)
	if err := bn.setLimit(ctx, topic); err != nil {
		return r, err
	}
	d, err := bn.bulkSubmit(ctx, topic, cfg.jobs)
	if err != nil {
		return r, fmt.Errorf("bulk submit: %w", err)
	}
	r.SubmitPerSec = float64(cfg.jobs) / d.Seconds()
	fmt.Fprintf(bn.out, "  bulk submit   %8d jobs in %7.3fs  %10s jobs/s\n", cfg.jobs, d.Seconds(), fmtNum(r.SubmitPerSec))
	if err := bn.settle(ctx); err != nil {
		return r, err
	}

	// Burn-down.
	var wal walMeter
	if err := wal.start(ctx, bn.admin); err != nil {
		return r, err
	}
	var cpu cpuMeter
	cpu.start()
	d, err = bn.burnDown(ctx, topic, cfg.jobs)
	if err != nil {
		return r, fmt.Errorf("burn-down: %w", err)
	}
	r.BurnCPUPerMsg, r.BurnMachineCPUPerMsg = cpu.perMessage(cfg.jobs)
	r.BurnSecs = d.Seconds()
	r.BurnPerSec = float64(cfg.jobs) / d.Seconds()
	if r.BurnWALPerMsg, err = wal.perMessage(ctx, cfg.jobs); err != nil {
		return r, err
	}
	fmt.Fprintf(bn.out, "  burn-down     %8d jobs in %7.3fs  %10s jobs/s  %s%s%s  (%s)\n", cfg.jobs, d.Seconds(), fmtNum(r.BurnPerSec),
		bn.mode(), wal.note(r.BurnWALPerMsg), cpuNote(r.BurnCPUPerMsg, r.BurnMachineCPUPerMsg), bn.calls)
	if err := bn.checkReports(ctx, topic, cfg.jobs); err != nil {
		return r, fmt.Errorf("burn-down: %w", err)
	}

	// Steady stream, from a clean start: the burn-down's dirty pages are
	// flushed first (untimed), so the window measures the stream rather
	// than the writes a checkpoint of the burn-down's pages would make in
	// it.
	if err := bn.reset(ctx); err != nil {
		return r, err
	}
	bn.checkpoint(ctx)
	if err := bn.steady(ctx, bn.topic("steady", run), &r); err != nil {
		return r, fmt.Errorf("steady: %w", err)
	}
	fmt.Fprintf(bn.out, "  steady        %8d jobs at %6.0f/s  latency p50 %s  p95 %s  p99 %s  max %s ms  (Submit p50 %s  p99 %s ms)\n",
		r.SteadyN, r.SteadyRate, fmtNum(r.SteadyP50), fmtNum(r.SteadyP95), fmtNum(r.SteadyP99), fmtNum(r.SteadyMax),
		fmtNum(r.SubmitP50), fmtNum(r.SubmitP99))
	return r, nil
}

func benchPayload(i int) json.RawMessage {
	return json.RawMessage(`{"seq":` + strconv.Itoa(i) + `}`)
}

// bulkSubmit queues n messages of the no-op task on topic and returns how
// long it took.
func (bn *bench) bulkSubmit(ctx context.Context, topic string, n int) (time.Duration, error) {
	cfg := bn.cfg
	batch := 1
	if cfg.submitBatch > 1 {
		batch = cfg.submitBatch
	}
	var (
		next     atomic.Int64 // the next message index to hand out
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	for range cfg.submitters {
		wg.Go(func() {
			reqs := make([]broker.SubmitRequest, 0, batch)
			for {
				from := int(next.Add(int64(batch))) - batch
				if from >= n || ctx.Err() != nil {
					return
				}
				to := min(from+batch, n)
				var err error
				if batch == 1 {
					_, err = bn.b.Submit(ctx, broker.SubmitRequest{Topic: topic, Task: benchTask, Payload: benchPayload(from)})
				} else {
					reqs = reqs[:0]
					for i := from; i < to; i++ {
						reqs = append(reqs, broker.SubmitRequest{Topic: topic, Task: benchTask, Payload: benchPayload(i)})
					}
					_, err = bn.b.SubmitMany(ctx, reqs)
				}
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					cancel()
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start), firstErr
}

// checkEmpty verifies that topic has nothing queued or running left.
func (bn *bench) checkEmpty(ctx context.Context, topic string) error {
	st, err := bn.b.Stats(ctx)
	if err != nil {
		return err
	}
	for _, ts := range st.Topics {
		if ts.Name == topic && (ts.Queued != 0 || ts.Running != 0) {
			return fmt.Errorf("topic %s still has %d queued and %d running after the phase", topic, ts.Queued, ts.Running)
		}
	}
	return nil
}

// burnDown starts a pool on topic, which holds n queued messages, and
// returns the time from just before Pool.Start until all n were reported
// done and the pool stopped with their reports stored (with -pool-only,
// until all n were reported done).
func (bn *bench) burnDown(ctx context.Context, topic string, n int) (time.Duration, error) {
	obs := newBenchObserver(n, false)
	p := bn.newPool(topic, obs)
	start := time.Now()
	if err := p.Start(ctx); err != nil {
		return 0, err
	}
	timer := time.NewTimer(bn.cfg.timeout)
	defer timer.Stop()
	var err error
	select {
	case <-obs.all:
	case <-timer.C:
		err = fmt.Errorf("timed out after %s with %d of %d finished", bn.cfg.timeout, obs.finished.Load(), n)
	case <-ctx.Done():
		err = ctx.Err()
	}
	d := time.Since(start)
	if serr := bn.stopPool(p); err == nil && serr != nil {
		err = serr
	}
	if !bn.cfg.poolOnly {
		d = time.Since(start) // until the last report was stored
	}
	if err != nil {
		return 0, err
	}
	if nd := obs.notDone.Load(); nd > 0 {
		return 0, fmt.Errorf("%d of %d attempts did not end done", nd, n)
	}
	return d, bn.checkEmpty(ctx, topic)
}

// steady runs the steady stream on topic.
func (bn *bench) steady(ctx context.Context, topic string, r *benchResult) error {
	cfg := bn.cfg
	n := max(1, int(math.Round(cfg.rate*cfg.duration.Seconds())))
	r.SteadyN = n
	if err := bn.setLimit(ctx, topic); err != nil {
		return err
	}
	obs := newBenchObserver(n, true)
	p := bn.newPool(topic, obs)
	if err := p.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = bn.stopPool(p) }()
	// Let the pool open its connections and reach its idle poll.
	time.Sleep(500 * time.Millisecond)
	return bn.stream(ctx, topic, r, obs, p.Wake)
}

// stream submits the steady stream to topic through bn.b, calling wake
// (when not nil) after each Submit, and records in r the latencies from
// just before each Submit to obs's report of the message done.
func (bn *bench) stream(ctx context.Context, topic string, r *benchResult, obs *benchObserver, wake func()) error {
	cfg := bn.cfg
	n := r.SteadyN

	type sub struct {
		id     int64
		before time.Time
		after  time.Time
	}
	subs := make([]sub, n)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	sem := make(chan struct{}, 64)
	interval := time.Duration(float64(time.Second) / cfg.rate)
	start := time.Now()
	for i := range n {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			req := broker.SubmitRequest{Topic: topic, Task: benchTask, Payload: benchPayload(i)}
			before := time.Now()
			id, err := bn.b.Submit(ctx, req)
			after := time.Now()
			if wake != nil {
				wake()
			}
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
				return
			}
			subs[i] = sub{id: id, before: before, after: after}
		})
	}
	wg.Wait()
	submitted := time.Since(start)
	if firstErr != nil {
		return firstErr
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	r.SteadyRate = float64(n) / submitted.Seconds()

	timer := time.NewTimer(cfg.timeout)
	defer timer.Stop()
	select {
	case <-obs.all:
	case <-timer.C:
		return fmt.Errorf("timed out with %d of %d finished", obs.finished.Load(), n)
	case <-ctx.Done():
		return ctx.Err()
	}
	if nd := obs.notDone.Load(); nd > 0 {
		return fmt.Errorf("%d of %d attempts did not end done", nd, n)
	}
	lat := make([]float64, 0, n)
	slat := make([]float64, 0, n)
	obs.mu.Lock()
	for _, s := range subs {
		fin, ok := obs.at[s.id]
		if !ok {
			obs.mu.Unlock()
			return fmt.Errorf("message %d was never reported finished", s.id)
		}
		lat = append(lat, ms(fin.Sub(s.before)))
		slat = append(slat, ms(s.after.Sub(s.before)))
	}
	obs.mu.Unlock()
	slices.Sort(lat)
	slices.Sort(slat)
	r.SteadyP50, r.SteadyP95, r.SteadyP99 = quantile(lat, 0.50), quantile(lat, 0.95), quantile(lat, 0.99)
	r.SteadyMax = lat[len(lat)-1]
	r.SubmitP50, r.SubmitP99 = quantile(slat, 0.50), quantile(slat, 0.99)
	return bn.checkEmpty(ctx, topic)
}
