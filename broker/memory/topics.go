package memory

import (
	"context"
	"sort"

	"github.com/taskhost/taskhost/broker"
)

// SetTopic applies patch to the topic's config, creating it with the
// defaults when missing, and returns the result.
func (b *Broker) SetTopic(ctx context.Context, name string, patch broker.TopicPatch) (broker.TopicConfig, error) {
	if err := broker.ValidateTopicName(name); err != nil {
		return broker.TopicConfig{}, err
	}
	if err := broker.ValidatePatch(patch); err != nil {
		return broker.TopicConfig{}, err
	}
	if err := b.begin(ctx); err != nil {
		return broker.TopicConfig{}, err
	}
	defer b.mu.Unlock()

	cfg := b.topic(name)
	if patch.ConcurrencyLimit != nil {
		cfg.ConcurrencyLimit = *patch.ConcurrencyLimit
	}
	if patch.DeadLetterEnabled != nil {
		cfg.DeadLetterEnabled = *patch.DeadLetterEnabled
	}
	if patch.Paused != nil {
		cfg.Paused = *patch.Paused
	}
	return *cfg, nil
}

// Topics lists the topic configs by name.
func (b *Broker) Topics(ctx context.Context) ([]broker.TopicConfig, error) {
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()

	out := make([]broker.TopicConfig, 0, len(b.topics))
	for _, cfg := range b.topics {
		out = append(out, *cfg)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Drain pauses the topic (creating its config when missing): Claim hands
// out nothing more from it while running messages finish.
func (b *Broker) Drain(ctx context.Context, topic string) error {
	paused := true
	_, err := b.SetTopic(ctx, topic, broker.TopicPatch{Paused: &paused})
	return err
}

// Purge deletes the topic's queued messages (delayed ones too) and, when
// deadLetters is set, its dead ones. Running messages are never touched.
// An unknown topic purges nothing.
func (b *Broker) Purge(ctx context.Context, topic string, deadLetters bool) (broker.PurgeResult, error) {
	if err := broker.ValidateTopicName(topic); err != nil {
		return broker.PurgeResult{}, err
	}
	if err := b.begin(ctx); err != nil {
		return broker.PurgeResult{}, err
	}
	defer b.mu.Unlock()

	var res broker.PurgeResult
	for _, e := range b.queues[topic] {
		b.remove(e)
		res.Queued++
	}
	delete(b.queues, topic)
	if deadLetters {
		for _, e := range b.msgs {
			if e.m.Topic == topic && e.m.State == broker.StateDead {
				b.unfinish(e)
				b.remove(e)
				res.DeadLetter++
			}
		}
	}
	return res, nil
}
