package sqlstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/taskhost/taskhost/broker"
)

var _ broker.ScheduleStore = (*Store)(nil)

// scanSchedule reads a row of Queries.ScheduleCols.
func (s *Store) scanSchedule(r Row) (broker.Schedule, error) {
	var (
		sc       broker.Schedule
		payload  string
		interval *int64
		cron     *string
		key      *string
	)
	err := r.Scan(&sc.Name, &sc.Task, &sc.Topic, &payload, &interval, &cron, &sc.Enabled, &sc.MissedPolicy, &sc.Source,
		s.d.NullTime(&sc.LastAttempt), s.d.NullTime(&sc.LastSuccess), s.d.NullTime(&sc.ExpectedNextRun),
		s.d.Time(&sc.CreatedAt), s.d.Time(&sc.UpdatedAt), s.d.NullTime(&sc.NextFireAt), &key)
	if err != nil {
		return broker.Schedule{}, err
	}
	sc.Payload = json.RawMessage(payload)
	if interval != nil {
		sc.IntervalSeconds = int(*interval)
	}
	if cron != nil {
		sc.Cron = *cron
	}
	if key != nil {
		sc.UniqueKey = *key
	}
	return sc, nil
}

// PutSchedule validates s (see broker.NormalizeSchedule) and creates or
// replaces the schedule named s.Name in one statement. A replaced schedule
// keeps its run state (last_attempt, last_success, expected_next_run) and
// created_at, except that expected_next_run is cleared when
// interval_seconds or cron changed. updated_at (and created_at on
// creation) is now; next_fire_at is expected_next_run as kept, or when
// there is none the start of the second of updated_at. It returns the
// schedule as stored.
func (s *Store) PutSchedule(ctx context.Context, sc broker.Schedule) (broker.Schedule, error) {
	sc, err := broker.NormalizeSchedule(sc)
	if err != nil {
		return broker.Schedule{}, err
	}
	if err := broker.CheckSchedulePayload(sc, s.maxPayload); err != nil {
		return broker.Schedule{}, err
	}
	var interval *int32
	if sc.IntervalSeconds > 0 {
		v := int32(sc.IntervalSeconds) // at most broker.MaxIntervalSeconds
		interval = &v
	}
	var cron *string
	if sc.Cron != "" {
		cron = &sc.Cron
	}
	var uniqueKey *string
	if sc.UniqueKey != "" {
		uniqueKey = &sc.UniqueKey
	}
	var out broker.Schedule
	err = s.d.Write(ctx, "put schedule", func(c Conn) error {
		var err error
		out, err = s.scanSchedule(c.QueryRow(s.q.PutSchedule,
			sc.Name, sc.Task, sc.Topic, string(sc.Payload), interval, cron, sc.Enabled, sc.MissedPolicy, sc.Source, uniqueKey, Now))
		return err
	})
	if err != nil {
		return broker.Schedule{}, err
	}
	return out, nil
}

// GetSchedule returns the schedule; broker.ErrNotFound when there is none.
func (s *Store) GetSchedule(ctx context.Context, name string) (broker.Schedule, error) {
	return one(ctx, s, "get schedule", fmt.Sprintf("schedule %q", name), s.scanSchedule, s.q.GetSchedule, name)
}

// ListSchedules returns every schedule, by name.
func (s *Store) ListSchedules(ctx context.Context) ([]broker.Schedule, error) {
	return list(ctx, s, "list schedules", s.scanSchedule, s.q.ListSchedules)
}

// DueSchedules returns the enabled schedules whose next_fire_at is not
// after f.At, by (next_fire_at, name), after (f.AfterNext, f.AfterName)
// when AfterName is set, at most broker.DueLimit(f): one range scan of the
// due index.
func (s *Store) DueSchedules(ctx context.Context, f broker.DueFilter) ([]broker.Schedule, error) {
	limit := broker.DueLimit(f)
	if f.AfterName == "" {
		return list(ctx, s, "due schedules", s.scanSchedule, s.q.DueSchedules, At(f.At), limit)
	}
	return list(ctx, s, "due schedules", s.scanSchedule, s.q.DueSchedulesAfter, At(f.At), At(f.AfterNext), f.AfterName, limit)
}

// DeferSchedule moves a never-fired schedule's next_fire_at forward to
// until when it is unchanged since sc was read (same updated_at) and
// until is later; it reports whether it did.
func (s *Store) DeferSchedule(ctx context.Context, sc broker.Schedule, until time.Time) (bool, error) {
	var n int64
	err := s.d.Write(ctx, "defer schedule", func(c Conn) error {
		var err error
		n, err = c.Exec(s.q.DeferSchedule, sc.Name, At(sc.UpdatedAt), At(until))
		return err
	})
	return n > 0, err
}

// DeleteSchedule removes the schedule and (by the foreign key's cascade)
// its record of fired slots, so a schedule created again under the name
// may fire those slots again; its reports stay. broker.ErrNotFound when
// there is none.
func (s *Store) DeleteSchedule(ctx context.Context, name string) error {
	return s.d.Write(ctx, "delete schedule", func(c Conn) error {
		return exactlyOne(c, fmt.Sprintf("schedule %q", name), s.q.DeleteSchedule, name)
	})
}

// FireSchedule fires slot req.Slot of schedule req.Name, at most once per
// (name, slot) across every process, in one transaction:
//
//   - the request is checked first (broker.ValidateFire: a name, a slot,
//     and req.Submit as Submit would check it);
//   - with req.Fence, the lease must be held by Fence.Holder at Fence.Term
//     and not expired (as a fenced ReclaimOrphans checks it), or nothing
//     changes and the error is broker.ErrNotLeader;
//   - the schedule must exist (broker.ErrNotFound); the dialect locks it
//     against other fires and its deletion where it locks rows;
//   - the (name, slot) row is inserted ON CONFLICT DO NOTHING: when it
//     already existed, the result is Fired false and nothing else changes;
//   - otherwise last_attempt becomes now and expected_next_run and
//     next_fire_at req.Next (NULL when zero), and req.Submit, when set, is queued as Submit
//     queues it (Dialect.InsertMessage) with header "schedule" set to the
//     name (broker.FireSubmit); its id is recorded in the fire row and
//     returned.
//
// Slots are compared at the dialect's time resolution.
func (s *Store) FireSchedule(ctx context.Context, req broker.FireRequest) (broker.FireResult, error) {
	if err := broker.ValidateFire(req); err != nil {
		return broker.FireResult{}, err
	}
	var sub *broker.SubmitRequest
	if req.Submit != nil {
		sr := broker.FireSubmit(req)
		sub = &sr
	}
	var res broker.FireResult
	err := s.d.Tx(ctx, "fire schedule", func(c Conn) error {
		if err := CheckFence(c, s.q, req.Fence); err != nil {
			return err
		}
		var err error
		res, err = s.fire(c, req, sub)
		if err == nil && res.Missing {
			err = fmt.Errorf("schedule %q: %w", req.Name, broker.ErrNotFound)
		}
		return err
	})
	if err != nil {
		return broker.FireResult{}, err
	}
	return res, nil
}

// FireSchedules fires each request as FireSchedule does, all in one
// transaction with one fence check; see broker.ScheduleStore.
func (s *Store) FireSchedules(ctx context.Context, reqs []broker.FireRequest) ([]broker.FireResult, error) {
	fence, err := broker.ValidateFires(reqs)
	if err != nil || len(reqs) == 0 {
		return []broker.FireResult{}, err
	}
	subs := make([]*broker.SubmitRequest, len(reqs))
	for i, req := range reqs {
		if req.Submit != nil {
			sr := broker.FireSubmit(req)
			subs[i] = &sr
		}
	}
	var out []broker.FireResult
	err = s.d.Tx(ctx, "fire schedules", func(c Conn) error {
		out = make([]broker.FireResult, len(reqs))
		if err := CheckFence(c, s.q, fence); err != nil {
			return err
		}
		for i, req := range reqs {
			var err error
			if out[i], err = s.fire(c, req, subs[i]); err != nil {
				return fmt.Errorf("schedule %q: %w", req.Name, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// fire fires one checked request within a transaction whose fence holds.
func (s *Store) fire(c Conn, req broker.FireRequest, sub *broker.SubmitRequest) (broker.FireResult, error) {
	var res broker.FireResult
	var one int
	if err := c.QueryRow(s.q.LockSchedule, req.Name).Scan(&one); err != nil {
		if errors.Is(err, ErrNoRows) {
			return broker.FireResult{Missing: true}, nil
		}
		return res, err
	}
	n, err := c.Exec(s.q.InsertFire, req.Name, At(req.Slot), Now)
	if err != nil || n == 0 {
		return res, err // n == 0: fired before, nothing changes
	}
	if _, err := c.Exec(s.q.MarkFired, req.Name, NullAt(req.Next), Now); err != nil {
		return res, err
	}
	res.Fired = true
	if sub == nil {
		return res, nil
	}
	if res.MessageID, err = s.d.InsertMessage(c, *sub); err != nil {
		if _, dup := broker.DuplicateOf(err); !dup {
			return broker.FireResult{}, err
		}
		res.Duplicate = true // MessageID is the holder of the key
	}
	_, err = c.Exec(s.q.FireMessage, req.Name, At(req.Slot), res.MessageID)
	return res, err
}
