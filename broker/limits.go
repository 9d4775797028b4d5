package broker

import "time"

// The one table of the limits on what a client may ask of the task
// system. Every broker checks them through ValidateSubmit,
// ValidateTopicName, CheckDelay and NormalizeSchedule, and the
// tasks_worker API, UI and config check them (and print them in their
// messages) from here, so a request the API accepts is one every broker
// stores, and the other way round.
//
// They bound what is written, never what is read: a message or schedule
// an earlier version stored under looser limits still loads.
const (
	// MaxTopicLen bounds a topic's name, in bytes.
	MaxTopicLen = 200
	// MaxTaskLen bounds a task's name, in bytes.
	MaxTaskLen = 200
	// MaxScheduleNameLen bounds a schedule's name, in characters.
	MaxScheduleNameLen = 200
	// MaxPayloadSize bounds a payload (JSON bytes): the default and the
	// highest value of max_payload_bytes, see SubmitRequest.
	MaxPayloadSize = 1 << 20
	// MaxResultSize bounds a task's result (JSON bytes): a larger one
	// fails the attempt in the worker instead of being written.
	MaxResultSize = 1 << 20
	// MaxJSONDepth bounds how deeply a payload, a schedule's payload or
	// a result nests arrays and objects: [] and {} are 1 deep, [[]] and
	// {"a": {}} 2 deep, a number or a string 0. Checks that walk JSON,
	// and the UI that lays it out, use memory that grows with the depth
	// (an indented line is as long as its depth): unbounded, a 20 KB
	// value nested 10,000 deep takes gigabytes to show. 100 is what
	// Ruby's JSON (max_nesting) and protobuf's JSON parsers allow by
	// default, so data other systems produce fits, while real payloads
	// rarely go past a dozen levels; at 100, checking is a few KB of
	// state and an indented line at most 200 spaces.
	MaxJSONDepth = 100
	// MaxDelay bounds a submit's, a retry's or a requeue's delay.
	MaxDelay = 365 * 24 * time.Hour
	// MaxAttempts bounds a message's max_attempts (0 is the task's
	// default).
	MaxAttempts = 1000
	// MaxConcurrencyLimit bounds a topic's concurrency_limit (0 is
	// unlimited; a 32-bit column in the SQL stores).
	MaxConcurrencyLimit = 1<<31 - 1
	// MaxIntervalSeconds bounds a schedule's interval (a 32-bit column in
	// the SQL stores; some 68 years).
	MaxIntervalSeconds = 1<<31 - 1
	// DefaultListLimit and MaxListLimit: a list of messages or reports
	// gives DefaultListLimit rows unless asked for more, and at most
	// MaxListLimit.
	DefaultListLimit = 50
	MaxListLimit     = 1000
	// ListReports limits: Limit 0 or less means DefaultReportLimit, and
	// it is capped at MaxReportLimit.
	DefaultReportLimit = DefaultListLimit
	MaxReportLimit     = MaxListLimit
)

// maxDelayText is MaxDelay in words, for messages.
const maxDelayText = "365 days"
