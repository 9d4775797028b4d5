package sqlstore

import (
	"context"

	"github.com/taskhost/taskhost/broker"
)

// ScanTopic reads a row of (name, concurrency_limit, dead_letter_enabled,
// paused).
func ScanTopic(r Row) (broker.TopicConfig, error) {
	var t broker.TopicConfig
	err := r.Scan(&t.Name, &t.ConcurrencyLimit, &t.DeadLetterEnabled, &t.Paused)
	return t, err
}

// SetTopic applies patch to the topic's config, creating it with the
// defaults (no limit, dead-lettering, not paused) when missing, and
// returns the result.
func (s *Store) SetTopic(ctx context.Context, name string, patch broker.TopicPatch) (broker.TopicConfig, error) {
	if err := broker.ValidateTopicName(name); err != nil {
		return broker.TopicConfig{}, err
	}
	if err := broker.ValidatePatch(patch); err != nil {
		return broker.TopicConfig{}, err
	}
	var cfg broker.TopicConfig
	err := s.d.Write(ctx, "set topic", func(c Conn) error {
		var err error
		cfg, err = ScanTopic(c.QueryRow(s.q.SetTopic, name, patch.ConcurrencyLimit, patch.DeadLetterEnabled, patch.Paused))
		return err
	})
	if err != nil {
		return broker.TopicConfig{}, err
	}
	return cfg, nil
}

// Topics lists the topic configs by name.
func (s *Store) Topics(ctx context.Context) ([]broker.TopicConfig, error) {
	return list(ctx, s, "topics", ScanTopic, s.q.Topics)
}

// Drain pauses the topic (creating its config when missing): Claim hands
// out nothing more from it while running messages finish.
func (s *Store) Drain(ctx context.Context, topic string) error {
	paused := true
	_, err := s.SetTopic(ctx, topic, broker.TopicPatch{Paused: &paused})
	return err
}
