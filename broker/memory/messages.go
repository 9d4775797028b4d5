package memory

import (
	"context"
	"encoding/json"
	"slices"
	"sort"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// Submit validates req and queues it; see the package documentation.
func (b *Broker) Submit(ctx context.Context, req broker.SubmitRequest) (int64, error) {
	if err := broker.ValidateSubmit(req, 0); err != nil {
		return 0, err
	}
	if err := b.begin(ctx); err != nil {
		return 0, err
	}
	defer b.mu.Unlock()
	id, dup := b.submitLocked(req)
	if dup {
		return id, &broker.DuplicateError{ID: id, Key: req.UniqueKey}
	}
	return id, nil
}

var _ broker.BatchSubmitter = (*Broker)(nil)

// SubmitMany queues reqs at once, or none of them when one is invalid.
func (b *Broker) SubmitMany(ctx context.Context, reqs []broker.SubmitRequest) ([]int64, error) {
	out, err := b.SubmitBatch(ctx, reqs)
	return broker.IDs(out), err
}

// SubmitBatch queues reqs at once, or none of them when one is invalid,
// and says which were duplicates.
func (b *Broker) SubmitBatch(ctx context.Context, reqs []broker.SubmitRequest) ([]broker.Submitted, error) {
	if err := broker.ValidateSubmitMany(reqs, 0); err != nil {
		return nil, err
	}
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()
	out := make([]broker.Submitted, len(reqs))
	first := broker.FirstOfKey(reqs)
	for i, req := range reqs {
		if first[i] >= 0 {
			out[i] = broker.Submitted{ID: out[first[i]].ID, Duplicate: true}
			continue
		}
		id, dup := b.submitLocked(req)
		out[i] = broker.Submitted{ID: id, Duplicate: dup}
	}
	return out, nil
}

// submitLocked queues the valid req, or returns the id of the message
// holding its unique key and true; b.mu is held.
func (b *Broker) submitLocked(req broker.SubmitRequest) (int64, bool) {
	now := b.now()
	if id, held := b.keyHolder(req, now); held {
		return id, true
	}
	b.topic(req.Topic)
	b.nextID++
	payload := json.RawMessage(`{}`)
	if len(req.Payload) > 0 {
		payload = slices.Clone(req.Payload)
	}
	e := &entry{m: broker.Message{
		ID:          b.nextID,
		Topic:       req.Topic,
		Task:        req.Task,
		Payload:     payload,
		Headers:     cloneHeaders(req.Headers),
		State:       broker.StateQueued,
		Priority:    req.Priority,
		UniqueKey:   req.UniqueKey,
		MaxAttempts: req.MaxAttempts,
		AvailableAt: req.AvailableAt(now),
		CreatedAt:   now,
	}, states: broker.UniqueStates(req)}
	b.msgs[e.m.ID] = e
	b.ids = append(b.ids, e.m.ID)
	b.enqueue(e)
	if req.UniqueKey != "" {
		if b.keys == nil {
			b.keys = make(map[string]*keyState)
		}
		ks := b.keys[req.UniqueKey]
		if ks == nil {
			ks = &keyState{}
			b.keys[req.UniqueKey] = ks
		}
		ks.lastID, ks.lastAt = e.m.ID, now
		ks.ids = append(ks.ids, e.m.ID)
	}
	return e.m.ID, false
}

// keyHolder returns the message that holds req's unique key at now, if
// any: one in its unique states, or, with req.UniqueFor, the latest
// created less than that long ago. Messages deleted since are forgotten.
func (b *Broker) keyHolder(req broker.SubmitRequest, now time.Time) (int64, bool) {
	if req.UniqueKey == "" {
		return 0, false
	}
	ks := b.keys[req.UniqueKey]
	if ks == nil {
		return 0, false
	}
	if id, ok := b.stateHolder(ks, 0); ok {
		return id, true
	}
	if req.UniqueFor > 0 && now.Sub(ks.lastAt) < req.UniqueFor {
		return ks.lastID, true
	}
	if len(ks.ids) == 0 && now.Sub(ks.lastAt) > broker.MaxDelay {
		delete(b.keys, req.UniqueKey) // no message and past any window
	}
	return 0, false
}

// stateHolder returns the message of ks, other than except, that is in
// one of its unique states, dropping the deleted ones from ks.
func (b *Broker) stateHolder(ks *keyState, except int64) (int64, bool) {
	ks.ids = slices.DeleteFunc(ks.ids, func(id int64) bool { return b.msgs[id] == nil })
	for _, id := range ks.ids {
		if e := b.msgs[id]; id != except && broker.HoldsKey(e.m.State, e.states) {
			return id, true
		}
	}
	return 0, false
}

// topic returns name's config, creating it with the defaults.
func (b *Broker) topic(name string) *broker.TopicConfig {
	cfg := b.topics[name]
	if cfg == nil {
		cfg = &broker.TopicConfig{Name: name, DeadLetterEnabled: true}
		b.topics[name] = cfg
	}
	return cfg
}

// enqueue inserts a queued message in its topic's queue.
func (b *Broker) enqueue(e *entry) {
	q := b.queues[e.m.Topic]
	i := sort.Search(len(q), func(i int) bool { return before(e, q[i]) })
	b.queues[e.m.Topic] = slices.Insert(q, i, e)
}

// before orders queued messages by (priority descending, available_at,
// id).
func before(a, c *entry) bool {
	if a.m.Priority != c.m.Priority {
		return a.m.Priority > c.m.Priority
	}
	if !a.m.AvailableAt.Equal(c.m.AvailableAt) {
		return a.m.AvailableAt.Before(c.m.AvailableAt)
	}
	return a.m.ID < c.m.ID
}

// Claim takes up to req.Max available messages; see the package
// documentation.
func (b *Broker) Claim(ctx context.Context, req broker.ClaimRequest) ([]broker.Message, error) {
	if req.WorkerID == "" {
		return nil, broker.Invalid("worker id is empty")
	}
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()

	want := max(req.Max, 1)
	topics := broker.ClaimOrder(req.Topics, b.rr)
	if len(topics) == 0 {
		return nil, nil
	}
	b.rr++

	now := b.now()
	var out []broker.Message
	for len(out) < want {
		progress := false
		for i := 0; i < len(topics) && len(out) < want; i++ {
			t := topics[i]
			cfg := b.topics[t]
			if cfg == nil || cfg.Paused {
				continue
			}
			if cfg.ConcurrencyLimit > 0 && b.runningBy[t] >= cfg.ConcurrencyLimit {
				continue
			}
			q := b.queues[t]
			at := slices.IndexFunc(q, func(e *entry) bool { return !e.m.AvailableAt.After(now) })
			if at < 0 {
				continue
			}
			e := q[at]
			if at == 0 {
				q[0] = nil
				b.queues[t] = q[1:]
			} else {
				b.queues[t] = slices.Delete(q, at, at+1)
			}

			claimedAt := now
			e.m.State = broker.StateRunning
			e.m.ClaimedBy = req.WorkerID
			e.m.ClaimedAt = &claimedAt
			e.m.Attempts++
			e.m.Token = broker.NewToken()
			b.running[e.m.ID] = e
			b.runningBy[t]++

			m := copyMessage(&e.m)
			m.Token = e.m.Token
			out = append(out, m)
			progress = true
		}
		if !progress {
			break
		}
	}
	return out, nil
}

// held returns the running message c names, or nil when c does not hold it.
func (b *Broker) held(c broker.Claim) *entry {
	e := b.running[c.ID]
	if e == nil || c.Token == "" || e.m.Token != c.Token {
		return nil
	}
	return e
}

// release ends e's claim: it leaves the running set, its token is cleared
// and the locks held under it are released.
func (b *Broker) release(e *entry) {
	delete(b.running, e.m.ID)
	b.runningBy[e.m.Topic]--
	if b.runningBy[e.m.Topic] <= 0 {
		delete(b.runningBy, e.m.Topic)
	}
	for name, l := range b.locks {
		if l.token == e.m.Token {
			delete(b.locks, name)
		}
	}
	e.m.Token = ""
}

// finish moves e (no longer running) to a finished state.
func (b *Broker) finish(e *entry, state string, now time.Time) {
	e.m.State = state
	e.m.FinishedAt = &now
	if state == broker.StateDead {
		b.deadBy[e.m.Topic]++
	}
	b.finSeq++
	e.finSeq = b.finSeq
	b.finQ = append(b.finQ, finRef{id: e.m.ID, seq: e.finSeq})
	b.finished++
	b.trim()
}

// unfinish takes e out of the finished states' books, before it is
// requeued or deleted.
func (b *Broker) unfinish(e *entry) {
	if e.finSeq == 0 {
		return
	}
	e.finSeq = 0
	b.finished--
	if e.m.State == broker.StateDead {
		b.deadBy[e.m.Topic]--
		if b.deadBy[e.m.Topic] <= 0 {
			delete(b.deadBy, e.m.Topic)
		}
	}
}

// trim drops the oldest finished messages past Retain and compacts finQ.
func (b *Broker) trim() {
	limit := b.retain()
	for b.finished > limit && len(b.finQ) > 0 {
		ref := b.finQ[0]
		b.finQ = b.finQ[1:]
		if e := b.msgs[ref.id]; e != nil && e.finSeq == ref.seq {
			b.unfinish(e)
			b.remove(e)
		}
	}
	if len(b.finQ) > 2*b.finished+1024 {
		live := make([]finRef, 0, b.finished)
		for _, ref := range b.finQ {
			if e := b.msgs[ref.id]; e != nil && e.finSeq == ref.seq {
				live = append(live, ref)
			}
		}
		b.finQ = live
	}
}

// remove deletes a message that is not queued or running.
func (b *Broker) remove(e *entry) {
	delete(b.msgs, e.m.ID)
	b.deleted++
	if b.deleted > 1024 && b.deleted > len(b.ids)/2 {
		ids := make([]int64, 0, len(b.msgs))
		for _, id := range b.ids {
			if b.msgs[id] != nil {
				ids = append(ids, id)
			}
		}
		b.ids = ids
		b.deleted = 0
	}
}

// Ack marks the outcomes' messages done; see the package documentation.
// A result that is not JSON makes the whole call fail with
// broker.ErrInvalid before anything changes.
func (b *Broker) Ack(ctx context.Context, outcomes []broker.Outcome) ([]error, error) {
	if err := broker.CheckOutcomes(outcomes); err != nil {
		return nil, err
	}
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()

	now := b.now()
	errs := make([]error, len(outcomes))
	for i, o := range outcomes {
		e := b.held(o.Claim)
		if e == nil {
			errs[i] = broker.ErrClaimLost
			continue
		}
		b.release(e)
		if len(o.Result) > 0 {
			e.m.Result = slices.Clone(o.Result)
		}
		b.finish(e, broker.StateDone, now)
		b.reportOutcome(o.Report)
	}
	return errs, nil
}

// Nack ends an attempt without success; see the package documentation.
func (b *Broker) Nack(ctx context.Context, req broker.NackRequest) error {
	if err := broker.CheckDelay(req.Delay); err != nil {
		return err
	}
	if err := broker.CheckOutcomeReport(req.Claim, req.Report); err != nil {
		return err
	}
	req.Error = broker.CleanText(req.Error)
	if err := b.begin(ctx); err != nil {
		return err
	}
	defer b.mu.Unlock()

	e := b.held(req.Claim)
	if e == nil {
		return broker.ErrClaimLost
	}
	b.reportOutcome(req.Report)
	now := b.now()
	b.release(e)
	e.m.LastError = req.Error
	e.m.Suspect, e.m.WaitingSince = req.Suspect, nil
	if req.Cancel || (req.Requeue && e.m.CancelRequestedAt != nil) {
		if e.m.LastError == "" {
			e.m.LastError = broker.CancelledError
		}
		b.finish(e, broker.StateCancelled, now)
		return nil
	}
	if req.Requeue {
		if req.WaitingSince != nil {
			t := *req.WaitingSince
			e.m.WaitingSince = &t
		}
		if req.NotRun && e.m.Attempts > 0 {
			e.m.Attempts--
		}
		b.requeue(e, now.Add(req.Delay))
		return nil
	}
	state := broker.StateFailed
	if b.topic(e.m.Topic).DeadLetterEnabled {
		state = broker.StateDead
	}
	b.finish(e, state, now)
	return nil
}

// reportOutcome stores the report of an outcome being applied, if any, as
// AddReports does; b.mu is held, so the two are one change.
func (b *Broker) reportOutcome(r *broker.Report) {
	if r != nil {
		b.addReports([]broker.Report{*r})
	}
}

// requeue queues e (not running) again, available at at.
func (b *Broker) requeue(e *entry, at time.Time) {
	b.unfinish(e)
	e.m.State = broker.StateQueued
	e.m.ClaimedBy = ""
	e.m.ClaimedAt = nil
	e.m.Token = ""
	e.m.FinishedAt = nil
	e.m.CancelRequestedAt = nil
	e.m.AvailableAt = at
	b.enqueue(e)
}

// DeadLetter ends an attempt dead with reason as its last error, whatever
// the topic's dead-letter setting.
func (b *Broker) DeadLetter(ctx context.Context, c broker.Claim, reason string, report *broker.Report) error {
	if err := broker.CheckOutcomeReport(c, report); err != nil {
		return err
	}
	reason = broker.CleanText(reason)
	if err := b.begin(ctx); err != nil {
		return err
	}
	defer b.mu.Unlock()

	e := b.held(c)
	if e == nil {
		return broker.ErrClaimLost
	}
	b.release(e)
	b.reportOutcome(report)
	e.m.LastError = reason
	e.m.Suspect, e.m.WaitingSince = false, nil
	b.finish(e, broker.StateDead, b.now())
	return nil
}
