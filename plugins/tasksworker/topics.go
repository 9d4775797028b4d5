package tasksworker

// The config's topics: setting up a new topic at start without undoing
// an operator's change.

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
)

// applyTopics sets up the topics of the config. The broker's stored
// settings win: an operator who paused, resumed or resized a topic through
// the API or the UI is never undone by a restart. The config sets up a
// topic the broker does not have yet, and only a topic marked enforce has
// its settings applied at every start. A difference the config cannot
// apply is logged, so an operator who edited the file sees why it did not
// take.
func applyTopics(ctx context.Context, b broker.Broker, topics map[string]TopicSetting, log hclog.Logger) error {
	if len(topics) == 0 {
		return nil
	}
	list, err := b.Topics(ctx)
	if err != nil {
		return fmt.Errorf("read the topics' settings: %w", err)
	}
	stored := make(map[string]broker.TopicConfig, len(list))
	for _, t := range list {
		stored[t.Name] = t
	}
	for _, name := range sortedKeys(topics) {
		want := topics[name]
		have, exists := stored[name]
		diff := topicDiff(have, want.TopicPatch)
		if exists && !want.Enforce {
			if diff != "" {
				log.Warn("the config's settings of a topic differ from the stored ones, which stay: the config only sets up a new topic; "+
					"change it through the API or the task UI, or set enforce: true under topics."+name+" to apply the config at every start",
					"topic", name, "differences", diff)
			}
			continue
		}
		if _, err := b.SetTopic(ctx, name, want.TopicPatch); err != nil {
			if errors.Is(err, broker.ErrInvalid) {
				return invalid("topics."+name, "%v", err)
			}
			return fmt.Errorf("apply the settings of topic %q: %w", name, err)
		}
		switch {
		case !exists:
			log.Info("topic set up from the config", "topic", name)
		case diff != "":
			log.Warn("topic settings enforced from the config over the stored ones (enforce: true)", "topic", name, "changed", diff)
		}
	}
	return nil
}

// topicDiff says where patch would change cfg, as "key: stored X, config
// Y" pairs; empty when it changes nothing.
func topicDiff(cfg broker.TopicConfig, patch broker.TopicPatch) string {
	var d []string
	if v := patch.ConcurrencyLimit; v != nil && *v != cfg.ConcurrencyLimit {
		d = append(d, fmt.Sprintf("concurrency_limit: stored %d, config %d", cfg.ConcurrencyLimit, *v))
	}
	if v := patch.DeadLetterEnabled; v != nil && *v != cfg.DeadLetterEnabled {
		d = append(d, fmt.Sprintf("dead_letter_enabled: stored %t, config %t", cfg.DeadLetterEnabled, *v))
	}
	if v := patch.Paused; v != nil && *v != cfg.Paused {
		d = append(d, fmt.Sprintf("paused: stored %t, config %t", cfg.Paused, *v))
	}
	return strings.Join(d, "; ")
}
