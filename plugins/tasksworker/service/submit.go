package service

// Submitting a task, and placing a task (or a schedule of it) on its
// topic.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// Place returns the topic a client's message of task goes to (topic, or
// the task's own when empty) once it checked the topic's name (as
// CheckTopic does) and that a worker runs the task there: this one, or
// another live worker (the fleet's view), as hosts sharing a broker need
// not run the same plugins or claim the same topics. A task no live worker
// runs is accepted while task providers may still register it
// (tasks_worker's start-up grace, PendingProviders), on its topic or the
// default one, and its message waits for the task as package worker
// says. The error is a *Problem that says what is wrong: ErrUnavailable
// when it cannot be told.
func (s *Service) Place(ctx context.Context, task, topic string) (string, error) {
	t, local, pending := s.lookupSoon(ctx, task)
	if topic == "" {
		if !local {
			if topic, ok, err := s.placePending(ctx, task, "", pending); ok {
				return topic, err
			}
			return "", invalid("unknown task %q: it is not registered here (the tasks are %s); if a worker on another host runs it, name its topic in the request",
				task, strings.Join(s.reg.Names(), ", "))
		}
		topic = t.Topic
	}
	if err := s.CheckTopic(ctx, topic); err != nil {
		return "", invalid("bad topic: %v", err)
	}
	served := s.pool.Topics()
	if local && slices.Contains(served, topic) {
		return topic, nil
	}
	elsewhere, err := s.fleet.RunsElsewhere(task, topic)
	if err != nil {
		return "", &Problem{Kind: ErrUnavailable, Msg: fmt.Sprintf(
			"cannot tell whether a worker elsewhere runs task %q on topic %q: the broker's worker list cannot be read: %v; retry shortly", task, topic, err)}
	}
	if elsewhere {
		return topic, nil
	}
	if !local {
		if _, ok, err := s.placePending(ctx, task, topic, pending); ok {
			return topic, err
		}
		return "", invalid("unknown task %q: it is not registered here, and no live worker runs it on topic %q; the tasks here are %s",
			task, topic, strings.Join(s.reg.Names(), ", "))
	}
	return "", invalid("topic %q is not served by this worker (it claims from %s), nor by another live worker that runs %s: omit topic to use the task's own (%s), or add the topic under topics in the plugin config",
		topic, strings.Join(served, ", "), task, t.Topic)
}

// CheckTopic checks a topic a client names: strictly
// (broker.ValidateNewTopicName) unless the topic exists already, so that
// a name an earlier version stored can still be used and managed. The
// error is the broker's validation error.
func (s *Service) CheckTopic(ctx context.Context, topic string) error {
	err := broker.ValidateNewTopicName(topic)
	if err == nil || broker.ValidateTopicName(topic) != nil {
		return err
	}
	if topics, lerr := s.b.Topics(ctx); lerr == nil {
		for _, t := range topics {
			if t.Name == topic {
				return nil
			}
		}
	}
	return err
}

// SubmitRequest is a task to run, as a client asks for it.
type SubmitRequest struct {
	Task  string
	Topic string // "": the task's own
	// Payload is JSON; empty or null is {}.
	Payload json.RawMessage
	// DelaySeconds postpones the first attempt, from 0 to
	// broker.MaxDelay.
	DelaySeconds float64
	// MaxAttempts is from 0 (the task's default) to broker.MaxAttempts.
	MaxAttempts int
	// RunAt, when set, is when the first attempt may start (exclusive
	// with DelaySeconds; see broker.SubmitRequest.RunAt).
	RunAt time.Time
	// Priority is from broker.MinPriority to broker.MaxPriority; higher
	// runs first.
	Priority int
	// UniqueKey, UniqueForSeconds and UniqueStates make a duplicate
	// submit answer the task that holds the key (see
	// broker.SubmitRequest.UniqueKey). UniqueKeySet says the client named
	// a key, so that an empty one is refused.
	UniqueKey        string
	UniqueKeySet     bool
	UniqueForSeconds float64
	UniqueStates     []string
	// Headers are stored with the message as they are: the submitter and
	// the parent of a task a plugin submits (broker.SubmitterHeader,
	// broker.ParentHeader).
	Headers map[string]string
}

// Submit checks req, places it (Place) and stores the message; it returns
// the message's id and its topic. A duplicate (see
// SubmitRequest.UniqueKey) stores nothing and returns the id of the task
// that holds the key with a *broker.DuplicateError (broker.DuplicateOf).
func (s *Service) Submit(ctx context.Context, req SubmitRequest) (int64, string, error) {
	m, err := s.prepare(ctx, req, nil)
	if err != nil {
		return 0, "", err
	}
	id, err := s.b.Submit(ctx, m)
	if _, dup := broker.DuplicateOf(err); dup {
		return id, m.Topic, err
	}
	if err != nil {
		return 0, "", err
	}
	s.submitted(m.Topic)
	s.pool.Wake()
	return id, m.Topic, nil
}

// ItemError is the refusal of one request of a batch: Index is its place
// in the batch, from 0.
type ItemError struct {
	Index int
	Err   error
}

func (e *ItemError) Error() string { return fmt.Sprintf("item %d: %v", e.Index, e.Err) }
func (e *ItemError) Unwrap() error { return e.Err }

// Batch is requests that passed Submit's checks, as the broker stores
// them (Check, then Store).
type Batch struct {
	msgs []broker.SubmitRequest
}

// Len is how many messages b holds.
func (b Batch) Len() int { return len(b.msgs) }

// Check checks reqs in order as Submit does, placing each distinct task
// and topic once. It returns the batch of the requests before the first
// refused one, and that refusal as an *ItemError (nil when all pass), so
// a caller can store what came before a bad request.
func (s *Service) Check(ctx context.Context, reqs []SubmitRequest) (Batch, error) {
	b := Batch{msgs: make([]broker.SubmitRequest, 0, len(reqs))}
	placed := placements{}
	for i, req := range reqs {
		m, err := s.prepare(ctx, req, placed)
		if err != nil {
			return b, &ItemError{Index: i, Err: err}
		}
		b.msgs = append(b.msgs, m)
	}
	return b, nil
}

// Store stores a checked batch in one transaction (SubmitBatch) and
// returns the ids in its order, saying which were duplicates (their id is
// the holder's; a unique key repeated within the batch collapses to its
// first request). Over broker.MaxSubmitBatch messages are refused.
func (s *Service) Store(ctx context.Context, b Batch) ([]broker.Submitted, error) {
	out, err := s.b.SubmitBatch(ctx, b.msgs)
	if err != nil {
		return nil, err
	}
	stored := false
	for i, m := range b.msgs {
		if !out[i].Duplicate {
			s.submitted(m.Topic)
			stored = true
		}
	}
	if stored {
		s.pool.Wake()
	}
	return out, nil
}

// SubmitMany is Submit for many requests, all or nothing in one
// transaction: it returns the ids in the order of reqs, saying which were
// duplicates (see Store). A refused request is an *ItemError naming it and
// nothing is stored; so are more than broker.MaxSubmitBatch requests (a
// *Problem).
func (s *Service) SubmitMany(ctx context.Context, reqs []SubmitRequest) ([]broker.Submitted, error) {
	if len(reqs) > broker.MaxSubmitBatch {
		return nil, invalid("%d tasks in one batch, the limit is %d: send several batches", len(reqs), broker.MaxSubmitBatch)
	}
	b, err := s.Check(ctx, reqs)
	if err != nil {
		return nil, err
	}
	return s.Store(ctx, b)
}

// placements remembers Place's answers within one batch, by task and
// topic as requested.
type placements map[[2]string]placement

type placement struct {
	topic string
	err   error
}

// prepare checks req and turns it into the message the broker stores:
// placed (Place), the payload compacted ({} when empty or null), the
// defaults filled in. placed, when not nil, remembers placements.
func (s *Service) prepare(ctx context.Context, req SubmitRequest, placed placements) (broker.SubmitRequest, error) {
	if req.Task == "" {
		return broker.SubmitRequest{}, invalid("task is required: name one of the registered tasks (%s)", strings.Join(s.reg.Names(), ", "))
	}
	key := [2]string{req.Task, req.Topic}
	p, ok := placed[key]
	if !ok {
		p.topic, p.err = s.Place(ctx, req.Task, req.Topic)
		if placed != nil {
			placed[key] = p
		}
	}
	if p.err != nil {
		return broker.SubmitRequest{}, p.err
	}
	task, _ := s.reg.Lookup(req.Task) // zero for a task only another worker runs
	payload, err := checkPayload(req.Payload, s.settings.MaxPayloadBytes)
	if err != nil {
		return broker.SubmitRequest{}, err
	}
	if req.DelaySeconds < 0 || req.DelaySeconds > broker.MaxDelay.Seconds() {
		return broker.SubmitRequest{}, invalid("delay_seconds must be from 0 to %.0f, got %v", broker.MaxDelay.Seconds(), req.DelaySeconds)
	}
	if req.MaxAttempts < 0 || req.MaxAttempts > broker.MaxAttempts {
		return broker.SubmitRequest{}, invalid("max_attempts must be from 0 (the task's default, %d) to %d, got %d", task.MaxAttempts, broker.MaxAttempts, req.MaxAttempts)
	}
	maxAttempts := req.MaxAttempts
	if maxAttempts == 0 {
		maxAttempts = task.MaxAttempts
	}
	m := broker.SubmitRequest{
		Topic:        p.topic,
		Task:         req.Task,
		Payload:      payload,
		Delay:        time.Duration(req.DelaySeconds * float64(time.Second)),
		MaxAttempts:  maxAttempts,
		RunAt:        req.RunAt,
		Priority:     req.Priority,
		UniqueKey:    req.UniqueKey,
		UniqueStates: req.UniqueStates,
		Headers:      req.Headers,
	}
	if err := checkIntake(req, &m); err != nil {
		return broker.SubmitRequest{}, err
	}
	return m, nil
}

// checkPayload checks a payload a client gives, for a task or a
// schedule's tasks, and returns it as it is stored: compacted, {} when
// empty or null. It must pass broker.CheckJSON (what every store checks)
// and be at most maxPayload bytes compacted (max_payload_bytes; 0 means
// broker.MaxPayloadSize).
func checkPayload(raw json.RawMessage, maxPayload int) (json.RawMessage, error) {
	if maxPayload <= 0 {
		maxPayload = broker.MaxPayloadSize
	}
	payload := bytes.TrimSpace(raw)
	if len(payload) == 0 || string(payload) == "null" {
		payload = []byte("{}")
	}
	// CheckJSON reads the payload first, in memory bounded by the depth:
	// a payload nested thousands deep is refused before anything else
	// reads it.
	if err := broker.CheckJSON(payload); err != nil {
		return nil, invalid("payload: %v", err)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, payload); err == nil {
		payload = compact.Bytes()
	}
	if len(payload) > maxPayload {
		return nil, invalid("payload is %d bytes, the limit is %d (max_payload_bytes); send less, or store the data elsewhere and pass a reference", len(payload), maxPayload)
	}
	return payload, nil
}

// checkUniqueKey checks a unique key a client gives, for a task or a
// schedule's tasks; given says the client named one, so that an empty
// key is refused rather than dropped.
func checkUniqueKey(key string, given bool) error {
	if given && key == "" {
		return invalid("unique_key is empty: give a key of 1 to %d bytes, or leave the field out", broker.MaxUniqueKeyLen)
	}
	if len(key) > broker.MaxUniqueKeyLen {
		return invalid("unique_key is %d bytes long, the limit is %d", len(key), broker.MaxUniqueKeyLen)
	}
	return nil
}

// checkIntake checks req's unique key, priority and run-at time, filling
// in m's window; the messages name the API's fields.
func checkIntake(req SubmitRequest, m *broker.SubmitRequest) error {
	if err := checkUniqueKey(req.UniqueKey, req.UniqueKeySet); err != nil {
		return err
	}
	if req.UniqueStates != nil && len(req.UniqueStates) == 0 {
		return invalid("unique_states is empty: it must include %s; leave the field out for the default, %v", strings.Join(broker.DefaultUniqueStates, " and "), broker.DefaultUniqueStates)
	}
	if f := req.UniqueForSeconds; f < 0 || f > broker.MaxDelay.Seconds() {
		return invalid("unique_for_seconds must be from 0 to %.0f, got %v", broker.MaxDelay.Seconds(), f)
	}
	m.UniqueFor = time.Duration(req.UniqueForSeconds * float64(time.Second))
	if err := broker.ValidateIntake(*m, time.Now()); err != nil {
		return invalid("%s", strings.TrimPrefix(err.Error(), broker.ErrInvalid.Error()+": "))
	}
	return nil
}

// PayloadLock is the lock key a demo task's payload names ("lock"), if
// any.
func PayloadLock(payload json.RawMessage) string {
	var p struct {
		Lock string `json:"lock"`
	}
	_ = json.Unmarshal(payload, &p)
	return p.Lock
}
