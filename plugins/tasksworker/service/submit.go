package service

// Submitting a task, and placing a task (or a schedule of it) on its
// topic.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// Place returns the topic a message or schedule of task goes to (topic,
// or the task's own when empty) once it checked the topic's name and that
// a worker runs the task there: this one, or with client (a client's
// request) another live worker, hosts sharing a broker need not run the
// same plugins or claim the same topics; the config's schedules are
// checked against this worker alone, since other hosts may not be up yet.
// The error is a *Problem that says what is wrong: ErrUnavailable when it
// cannot be told.
func (s *Service) Place(ctx context.Context, task, topic string, client bool) (string, error) {
	t, local := s.reg.Lookup(task)
	if topic == "" {
		if !local {
			return "", invalid("unknown task %q: it is not registered here (the tasks are %s); if a worker on another host runs it, name its topic in the request",
				task, strings.Join(s.reg.Names(), ", "))
		}
		topic = t.Topic
	}
	check := broker.ValidateTopicName
	if client {
		check = func(topic string) error { return s.CheckTopic(ctx, topic) }
	}
	if err := check(topic); err != nil {
		return "", invalid("bad topic: %v", err)
	}
	served := s.pool.Topics()
	if local && slices.Contains(served, topic) {
		return topic, nil
	}
	if client {
		elsewhere, err := s.pool.RunsElsewhere(task, topic)
		if err != nil {
			return "", &Problem{Kind: ErrUnavailable, Msg: fmt.Sprintf(
				"cannot tell whether a worker elsewhere runs task %q on topic %q: the broker's worker list cannot be read: %v; retry shortly", task, topic, err)}
		}
		if elsewhere {
			return topic, nil
		}
	}
	if !local {
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
}

// Submit checks req, places it (Place) and stores the message; it returns
// the message's id and its topic.
func (s *Service) Submit(ctx context.Context, req SubmitRequest) (int64, string, error) {
	if req.Task == "" {
		return 0, "", invalid("task is required: name one of the registered tasks (%s)", strings.Join(s.reg.Names(), ", "))
	}
	topic, err := s.Place(ctx, req.Task, req.Topic, true)
	if err != nil {
		return 0, "", err
	}
	task, _ := s.reg.Lookup(req.Task) // zero for a task only another worker runs
	payload := bytes.TrimSpace(req.Payload)
	if len(payload) == 0 || string(payload) == "null" {
		payload = []byte("{}")
	}
	if err := broker.CheckJSONDepth(payload); errors.Is(err, broker.ErrTooDeep) {
		return 0, "", invalid("payload: %v", err)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, payload); err == nil {
		payload = compact.Bytes()
	}
	if max := s.settings.MaxPayloadBytes; len(payload) > max {
		return 0, "", invalid("payload is %d bytes, the limit is %d (max_payload_bytes); send less, or store the data elsewhere and pass a reference", len(payload), max)
	}
	if req.DelaySeconds < 0 || req.DelaySeconds > broker.MaxDelay.Seconds() {
		return 0, "", invalid("delay_seconds must be from 0 to %.0f, got %v", broker.MaxDelay.Seconds(), req.DelaySeconds)
	}
	if req.MaxAttempts < 0 || req.MaxAttempts > broker.MaxAttempts {
		return 0, "", invalid("max_attempts must be from 0 (the task's default, %d) to %d, got %d", task.MaxAttempts, broker.MaxAttempts, req.MaxAttempts)
	}
	maxAttempts := req.MaxAttempts
	if maxAttempts == 0 {
		maxAttempts = task.MaxAttempts
	}
	id, err := s.b.Submit(ctx, broker.SubmitRequest{
		Topic:       topic,
		Task:        req.Task,
		Payload:     payload,
		Delay:       time.Duration(req.DelaySeconds * float64(time.Second)),
		MaxAttempts: maxAttempts,
	})
	if err != nil {
		return 0, "", err
	}
	s.submitted(topic)
	s.pool.Wake()
	return id, topic, nil
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
