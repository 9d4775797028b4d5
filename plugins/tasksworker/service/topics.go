package service

// The operator's controls of the queues: a topic's settings, drain and
// purge, requeueing a finished message (a dead letter, say) and
// force-releasing a lock. Each wakes the worker pool when it may have
// made work claimable.

import (
	"context"
	"strings"

	"github.com/taskhost/taskhost/broker"
)

// SetTopic changes the settings patch names (creating the topic when it
// does not exist) and returns them all. The patch is checked as every
// broker checks it (broker.ValidatePatch), before the broker is called;
// the name is checked as every stored one is (broker.ValidateTopicName);
// a client's new name should pass CheckTopic first.
func (s *Service) SetTopic(ctx context.Context, topic string, patch broker.TopicPatch) (broker.TopicConfig, error) {
	if err := broker.ValidatePatch(patch); err != nil {
		return broker.TopicConfig{}, invalid("%s", strings.TrimPrefix(err.Error(), broker.ErrInvalid.Error()+": "))
	}
	if err := broker.ValidateTopicName(topic); err != nil {
		return broker.TopicConfig{}, err
	}
	cfg, err := s.b.SetTopic(ctx, topic, patch)
	if err != nil {
		return broker.TopicConfig{}, err
	}
	s.pool.Wake() // an unpaused or widened topic may have work
	return cfg, nil
}

// Drain pauses topic: it takes no new work, and its running tasks finish.
func (s *Service) Drain(ctx context.Context, topic string) error {
	if err := broker.ValidateTopicName(topic); err != nil {
		return err
	}
	if err := s.b.Drain(ctx, topic); err != nil {
		return err
	}
	s.pool.Wake()
	return nil
}

// Purge deletes topic's queued messages, and its dead letters with
// deadLetters; running ones are left alone.
func (s *Service) Purge(ctx context.Context, topic string, deadLetters bool) (broker.PurgeResult, error) {
	if err := broker.ValidateTopicName(topic); err != nil {
		return broker.PurgeResult{}, err
	}
	res, err := s.b.Purge(ctx, topic, deadLetters)
	if err != nil {
		return res, err
	}
	s.pool.Wake()
	return res, nil
}

// Requeue queues a failed or dead message again.
func (s *Service) Requeue(ctx context.Context, id int64) error {
	if err := s.b.Requeue(ctx, id); err != nil {
		return err
	}
	s.pool.Wake()
	return nil
}

// ReleaseLock force-releases the lock named name; released is false when
// it was not held. A task still running under it no longer holds it.
func (s *Service) ReleaseLock(ctx context.Context, name string) (released bool, err error) {
	return s.b.ForceReleaseLock(ctx, name)
}
