package broker

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// CheckDelay refuses a delay that is negative or over MaxDelay.
func CheckDelay(d time.Duration) error {
	if d < 0 {
		return Invalid("delay is negative")
	}
	if d > MaxDelay {
		return Invalid("delay is %s, the limit is %s (%s)", d, MaxDelay, maxDelayText)
	}
	return nil
}

// DefaultTopic is the topic of a task that names none.
const DefaultTopic = "default"

// taskNamePattern keeps task names printable and URL-safe.
var taskNamePattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.:/-]*$`)

// CheckTaskName says why no task can ever be registered under name (nil
// when one can): the rules package worker's registry applies to a name,
// here so that what submits and schedules tasks checks them without
// linking a worker. A message is stored under any name within MaxTaskLen
// (ValidateSubmit).
func CheckTaskName(name string) error {
	switch {
	case name == "":
		return errors.New("the task name is empty")
	case len(name) > MaxTaskLen:
		return fmt.Errorf("the task name is %d bytes long, the limit is %d", len(name), MaxTaskLen)
	case !taskNamePattern.MatchString(name):
		return errors.New("a task name may hold only letters, digits and _ . : / - (and not start with a punctuation mark)")
	}
	return nil
}

// ValidateTopicName checks a topic name.
func ValidateTopicName(topic string) error {
	if topic == "" {
		return Invalid("topic is empty")
	}
	if len(topic) > MaxTopicLen {
		return Invalid("topic is %d bytes long, the limit is %d", len(topic), MaxTopicLen)
	}
	return nil
}

// ValidateNewTopicName checks a topic name a client gives for something
// new (a submit, a schedule, a topic's first settings) more strictly than
// ValidateTopicName, which names that earlier versions stored must keep
// passing: valid UTF-8, no control characters, no white space at either
// end.
func ValidateNewTopicName(topic string) error {
	if err := ValidateTopicName(topic); err != nil {
		return err
	}
	if !utf8.ValidString(topic) {
		return Invalid("topic %q is not valid UTF-8", topic)
	}
	if strings.ContainsFunc(topic, unicode.IsControl) {
		return Invalid("topic %q holds a control character", topic)
	}
	if strings.TrimSpace(topic) != topic {
		return Invalid("topic %q starts or ends with white space", topic)
	}
	return nil
}

// ValidateSubmit checks a submit request; maxPayload 0 means MaxPayloadSize.
func ValidateSubmit(req SubmitRequest, maxPayload int) error {
	if maxPayload <= 0 {
		maxPayload = MaxPayloadSize
	}
	if err := ValidateTopicName(req.Topic); err != nil {
		return err
	}
	if req.Task == "" {
		return Invalid("task is empty")
	}
	if len(req.Task) > MaxTaskLen {
		return Invalid("task name is %d bytes long, the limit is %d", len(req.Task), MaxTaskLen)
	}
	if len(req.Payload) > maxPayload {
		return Invalid("payload is %d bytes, the limit is %d", len(req.Payload), maxPayload)
	}
	if len(req.Payload) > 0 {
		if err := CheckJSON(req.Payload); err != nil {
			return Invalid("payload: %v", err)
		}
	}
	if err := CheckDelay(req.Delay); err != nil {
		return err
	}
	if req.MaxAttempts < 0 {
		return Invalid("max_attempts is negative")
	}
	if req.MaxAttempts > MaxAttempts {
		return Invalid("max_attempts is %d, the limit is %d", req.MaxAttempts, MaxAttempts)
	}
	return ValidateIntake(req, time.Now())
}

// ValidatePatch checks a topic patch: its concurrency_limit, when set,
// is from 0 (unlimited) to MaxConcurrencyLimit.
func ValidatePatch(p TopicPatch) error {
	if n := p.ConcurrencyLimit; n != nil && (*n < 0 || *n > MaxConcurrencyLimit) {
		return Invalid("concurrency_limit must be from 0 (unlimited) to %d, got %d", MaxConcurrencyLimit, *n)
	}
	return nil
}
