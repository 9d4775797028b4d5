package worker

import (
	"sync"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// This file owns the handling of suspects: messages whose last worker died
// running them (see suspect). The dispatcher holds one at a time until the
// pool is idle and runs it alone (isolation); the others, and a suspect
// held too long, are given back to the queue without running (giveBacks).

// suspectHoldMax bounds how long a pool holds a suspect (see suspect)
// waiting for what it runs to finish, claiming nothing meanwhile; then the
// suspect goes back to the queue for as long. A variable for tests.
var suspectHoldMax = 30 * time.Second

// suspect reports whether m's last claim ended with its worker dead (the
// reaper requeued it as an orphan: broker.Message.Suspect). Such a message may be what killed that
// worker's process: the pool runs it alone, so that if it kills this one
// too, the messages running beside it are not orphaned with it, again and
// again until orphan_max_attempts dead-letters them with the poison.
func suspect(m broker.Message) bool {
	return m.Suspect
}

// isolation is the dispatcher's state about suspects: a suspect waits in
// held until it can run alone; alone is set while it runs. Nothing is
// claimed while one is held or runs. Only the dispatcher uses it.
type isolation struct {
	d     *dispatcher
	reg   *Registry
	back  *giveBacks
	held  *broker.Message
	since time.Time // when held was claimed
	alone bool
	timer *time.Timer // fires when held has waited suspectHoldMax
}

func newIsolation(d *dispatcher, reg *Registry, back *giveBacks) *isolation {
	t := time.NewTimer(0)
	<-t.C
	return &isolation{d: d, reg: reg, back: back, timer: t}
}

// settle moves the suspect on before a claim, given how many messages the
// workers have (inflight) and how many the exchanges in flight may still
// bring (coming): it runs the held one once the pool is idle, every
// outcome is written and no claim is out, or
// gives it back when the pool stays busy. It returns inflight, counting
// what it handed to the workers.
func (s *isolation) settle(inflight, coming int) int {
	d := s.d
	if s.alone && inflight == 0 {
		s.alone = false
	}
	if s.held != nil && (inflight > 0 || d.out.pending.Load() > 0) && time.Since(s.since) >= suspectHoldMax {
		// The pool stayed busy (long tasks): rather than claim
		// nothing for as long, give the suspect back for a while,
		// for an idle worker, or for this one later.
		d.log.Info("giving back a message whose last worker died running it: this worker stays busy and would claim nothing until it is idle",
			"message_id", s.held.ID, "task", s.held.Task, "retry_in", suspectHoldMax.String())
		s.back.markAfter(s.held.ClaimOf(), suspectHoldMax)
		d.exec.give(s.held)
		s.held = nil
		inflight++
	}
	// Alone means nothing else claimed by this pool: no handler busy, no
	// outcome still being written (a message given back, or acked, is
	// claimed by this worker until its write returns, and would be
	// orphaned with the suspect if it is the poison), and no claim out
	// whose messages would go to the workers beside it when it lands.
	if !s.alone && s.held != nil && inflight == 0 && coming == 0 && d.out.pending.Load() == 0 {
		d.log.Info("running a message whose last worker died while running it on its own, so that if it kills this process too, nothing else is lost with it",
			"message_id", s.held.ID, "task", s.held.Task)
		d.exec.give(s.held)
		s.held = nil
		s.alone, inflight = true, 1
	}
	return inflight
}

// blocks reports whether claiming waits: a suspect is held or runs alone.
func (s *isolation) blocks() bool { return s.alone || s.held != nil }

// holding reports whether a suspect is held.
func (s *isolation) holding() bool { return s.held != nil }

// holdOver fires when the held suspect has waited suspectHoldMax; nil when
// none is held.
func (s *isolation) holdOver() <-chan time.Time {
	if s.held == nil {
		return nil
	}
	s.timer.Reset(max(time.Until(s.since.Add(suspectHoldMax)), 0))
	return s.timer.C
}

// admit takes a claimed message: false when it is a suspect that it holds
// (it goes to the workers later), true when it goes to the workers now.
func (s *isolation) admit(m *broker.Message) bool {
	if s.d.n > 1 && suspect(*m) && s.runs(m.Task) {
		if s.held == nil {
			s.held, s.since = m, time.Now()
			return false
		}
		// One suspect is held at a time: held, the others
		// would die with it if it is the poison. They go back
		// at once (see handle), for any worker to take.
		s.back.mark(m.ClaimOf())
	}
	return true
}

// stop hands the held suspect to the workers, as the dispatcher stops:
// they requeue what was claimed and not run.
func (s *isolation) stop() {
	s.timer.Stop()
	if s.held != nil {
		s.d.exec.give(s.held)
		s.held = nil
	}
}

// runs reports whether this pool has task registered. A suspect of a task
// it does not run is not held: handle requeues it (still marked) for a
// worker that runs it, which isolates it.
func (s *isolation) runs(task string) bool {
	_, ok := s.reg.Lookup(task)
	return ok
}

// giveBacks are the claims that handle requeues at once without running
// them, with their delay (see mark).
type giveBacks struct {
	mu     sync.Mutex
	claims map[broker.Claim]time.Duration
}

// mark marks a claim that handle requeues at once without running it.
func (g *giveBacks) mark(c broker.Claim) { g.markAfter(c, 0) }

// markAfter is mark, the message available again after d.
func (g *giveBacks) markAfter(c broker.Claim, d time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.claims == nil {
		g.claims = map[broker.Claim]time.Duration{}
	}
	g.claims[c] = d
}

// take reports whether c was marked, with its delay, and unmarks it.
func (g *giveBacks) take(c broker.Claim) (time.Duration, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	d, ok := g.claims[c]
	delete(g.claims, c)
	return d, ok
}

// outcome is the outcome of c when the dispatcher gave its message back
// (mark): requeued without running. Nil when it did not.
func (g *giveBacks) outcome(c *completion) *completion {
	if !suspect(*c.msg) {
		return nil
	}
	d, ok := g.take(c.claim)
	if !ok {
		return nil
	}
	return c.notRun(d, "this worker runs another such message alone, or stays busy; requeued for a worker that can run it alone", StatusDeferred)
}
