package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// This file owns the completer's writes of outcomes to the broker: acks
// with the dispatcher's claims (exchange) or on their own (ackAll), nacks,
// the reading of each answer (acked, lose) and the retrying of writes that
// may pass.

// exchange writes acks and claims up to req.Max messages (none when it is
// 0) in one broker call when the broker is a broker.AckClaimer, else in an
// Ack and a Claim; parent bounds the calls (the dispatcher's claim
// context). The acks are finished (reported) once written; when they could
// not be written for a reason that may pass, they go back to the queue for
// the next call.
func (o *completer) exchange(parent context.Context, acks []*completion, req broker.ClaimRequest) ([]broker.Message, error) {
	ctx, cancel := context.WithTimeout(parent, brokerCallTimeout)
	defer cancel()
	if len(acks) == 0 {
		return o.b.Claim(ctx, req)
	}
	outcomes := o.outcomesOf(acks)
	var (
		errs []error
		msgs []broker.Message
		err  error
	)
	ac, both := o.b.(broker.AckClaimer)
	if both && req.Max > 0 {
		errs, msgs, err = ac.AckAndClaim(ctx, outcomes, req)
	} else {
		errs, err = o.b.Ack(ctx, outcomes)
	}
	if err != nil && !permanent(err) {
		// The call may have committed all the same: when the acks come
		// back refused as stale, acked checks whether they went through.
		markResent(acks)
		o.acks.requeue(acks)
		return nil, err
	}
	if errors.Is(err, broker.ErrInvalid) {
		// The broker refused an outcome, and the whole call with it:
		// write them one by one, so that only that one fails (acked).
		if len(acks) > 1 {
			o.log.Warn("the broker refused a batch of outcomes; writing them one by one", "error", err)
			for _, c := range acks {
				o.ackAll([]*completion{c})
			}
		} else {
			o.acked(acks, nil, err)
		}
		o.finish(acks, false)
		if req.Max == 0 {
			return nil, nil
		}
		cctx, ccancel := context.WithTimeout(parent, brokerCallTimeout)
		defer ccancel()
		return o.b.Claim(cctx, req)
	}
	o.acked(acks, errs, err)
	o.finish(acks, false)
	if err != nil || both || req.Max == 0 {
		return msgs, err
	}
	return o.b.Claim(ctx, req)
}

// outcomesOf is what the broker is told of acks, with their reports when
// they ride on them, and which of their messages have a unique key.
func (o *completer) outcomesOf(acks []*completion) []broker.Outcome {
	outcomes := make([]broker.Outcome, len(acks))
	for i, c := range acks {
		outcomes[i] = broker.Outcome{Claim: c.claim, Result: c.result, Report: o.carried(c), Keyed: c.msg != nil && c.msg.UniqueKey != ""}
	}
	return outcomes
}

// carried is the report that rides on c's outcome: nil when reports do
// not ride on outcomes (completer.carry) or c has none.
func (o *completer) carried(c *completion) *broker.Report {
	if !o.carry {
		return nil
	}
	r, ok := c.report(o.workerID)
	if !ok {
		return nil
	}
	return &r
}

// markResent notes that acks are about to be written again after a call
// that may have committed them (see acked).
func markResent(acks []*completion) {
	for _, c := range acks {
		c.resent = true
	}
}

// ackAll writes acks in one Ack call, retrying as retry does.
func (o *completer) ackAll(acks []*completion) {
	o.ackAllUntil(o.giveUpCtx, acks)
}

// ackAllUntil is ackAll, giving up when stop is done too.
func (o *completer) ackAllUntil(stop context.Context, acks []*completion) {
	outcomes := o.outcomesOf(acks)
	var errs []error
	tries := 0
	err := o.retryUntil(stop, "ack", func(ctx context.Context) error {
		if tries++; tries == 2 { // the first call may have committed
			markResent(acks)
		}
		var err error
		errs, err = o.b.Ack(ctx, outcomes)
		return err
	})
	o.acked(acks, errs, err)
}

// acked records the answer of an Ack: err for all, or errs one by one.
func (o *completer) acked(acks []*completion, errs []error, err error) {
	for i := range acks {
		e := err
		if e == nil && i < len(errs) {
			e = errs[i]
		}
		if e != nil && acks[i].resent && errors.Is(e, broker.ErrClaimLost) && o.ackedEarlier(acks[i]) {
			continue
		}
		if errors.Is(e, broker.ErrInvalid) {
			o.refuseResult(acks[i], e)
			continue
		}
		if e != nil {
			o.lose(acks[i], "ack", e)
		}
	}
}

// refuseResult ends c failed, for good, when the broker refused its
// result (a value out of the store's range, say, that CheckJSON cannot
// see): left running, the message would be taken back and run again for
// ever.
func (o *completer) refuseResult(c *completion, err error) {
	o.log.Warn("the broker refused a task's result; the attempt fails", "message_id", c.claim.ID, "task", c.task, "error", err)
	c.ack, c.result = false, nil
	c.fail(fmt.Sprintf("the task's result cannot be stored: %v", err), false, 0)
	o.nack(c)
}

// ackedEarlier reports whether c's message is done under c's own claim:
// an earlier write of the ack, whose answer was lost, committed after all,
// so the attempt is done rather than lost. A done message keeps who
// claimed it and when, and a claim of the same message by anyone since,
// this worker included, would show another claim time. The look-up is
// tried up to ackedEarlierTries times, a short pause apart, within
// brokerCallTimeout in all: on a flaky link, one failed read would record
// a done attempt as lost.
func (o *completer) ackedEarlier(c *completion) bool {
	ctx, cancel := context.WithTimeout(context.Background(), brokerCallTimeout)
	defer cancel()
	pause := 100 * time.Millisecond
	for try := 1; ; try++ {
		m, err := o.b.GetMessage(ctx, c.claim.ID)
		if err == nil {
			return m.State == broker.StateDone && m.ClaimedBy == o.workerID &&
				m.ClaimedAt != nil && c.msg.ClaimedAt != nil && m.ClaimedAt.Equal(*c.msg.ClaimedAt)
		}
		if permanent(err) {
			return false
		}
		if try >= ackedEarlierTries || ctx.Err() != nil {
			o.log.Warn("could not check whether an ack whose answer was lost went through", "message_id", c.claim.ID,
				"task", c.task, "tries", try, "error", err)
			return false
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
		pause = min(2*pause, time.Second)
	}
}

// ackedEarlierTries bounds the look-ups of ackedEarlier.
const ackedEarlierTries = 5

// nack writes a retry, a requeue or an end (dead letter), retrying as
// retry does.
func (o *completer) nack(c *completion) {
	req := broker.NackRequest{Claim: c.claim, Requeue: c.requeue, Delay: c.delay, Error: c.errText, NotRun: c.notRan,
		Suspect: c.suspect, WaitingSince: c.waitingSince, Cancel: c.cancel, Report: o.carried(c)}
	if err := o.retry("nack", func(ctx context.Context) error { return o.b.Nack(ctx, req) }); err != nil {
		o.lose(c, "nack", err)
	}
}

// lose records that an attempt's outcome was not written.
func (o *completer) lose(c *completion, op string, err error) {
	c.status = StatusLost
	if errors.Is(err, broker.ErrClaimLost) {
		o.log.Warn("claim lost: the message was taken back from this worker; its outcome is discarded",
			"op", op, "message_id", c.claim.ID, "task", c.task, "topic", c.topic)
		return
	}
	if !c.notRan {
		// It ran: when the stray check takes the message back, the
		// attempt stays counted.
		o.claims.ranAndLost(c.claim)
	}
	o.log.Error("could not record a task's outcome; the message stays running until it is reclaimed",
		"op", op, "message_id", c.claim.ID, "task", c.task, "topic", c.topic, "error", err)
}

// requeueUnheld requeues claim c, which the pool does not hold (a stray,
// or a message whose outcome could not be written; see strayCheck), in
// one try under ctx; notRun gives the attempt back. The stray check
// handles the error. It may be called after stop.
func (o *completer) requeueUnheld(ctx context.Context, c broker.Claim, notRun bool, reason string) error {
	return o.b.Nack(ctx, broker.NackRequest{Claim: c, Requeue: true, NotRun: notRun, Error: reason})
}

// retry calls f until it succeeds, fails for good (claim lost, not found,
// invalid, broker closed) or the pool gives up. It backs off between tries.
func (o *completer) retry(op string, f func(ctx context.Context) error) error {
	return o.retryUntil(o.giveUpCtx, op, f)
}

// retryUntil is retry, giving up when stop is done too. A try has
// brokerCallTimeout; once stop is done, one more try is made and a try
// still running gets lastTryTimeout more, so giving up takes that long at
// most even when the broker does not answer.
func (o *completer) retryUntil(stop context.Context, op string, f func(ctx context.Context) error) error {
	bo := retryBackoff()
	for {
		var (
			ctx    context.Context
			cancel context.CancelFunc
		)
		if stop.Err() != nil {
			ctx, cancel = context.WithTimeout(context.Background(), lastTryTimeout)
		} else {
			ctx, cancel = context.WithTimeout(context.Background(), brokerCallTimeout)
		}
		cut := context.AfterFunc(stop, func() { time.AfterFunc(lastTryTimeout, cancel) })
		err := f(ctx)
		cut()
		cancel()
		if err == nil || permanent(err) {
			return err
		}
		if stop.Err() != nil {
			return fmt.Errorf("%w (gave up retrying: the pool is stopping)", err)
		}
		d := bo.next()
		o.log.Warn("broker write failed; retrying", "op", op, "error", err, "retry_in", d.String())
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-stop.Done():
			t.Stop()
		}
	}
}

// permanent reports whether a failed broker write would fail again: the
// claim is lost, the message gone, the request invalid or the broker
// closed.
func permanent(err error) bool {
	return errors.Is(err, broker.ErrClaimLost) || errors.Is(err, broker.ErrNotFound) ||
		errors.Is(err, broker.ErrInvalid) || errors.Is(err, broker.ErrClosed)
}
