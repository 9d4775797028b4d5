package worker

import (
	"encoding/json"
	"fmt"
	"sync"
)

// maxLogLines bounds what one attempt keeps of its log, so a chatty task
// cannot grow without limit; the lines past it are counted, not kept.
const maxLogLines = 1000

// TaskContext is what a handler knows about the attempt it runs and how it
// reports back. Its methods are safe for concurrent use.
type TaskContext struct {
	// Payload is the message's payload as submitted.
	Payload json.RawMessage
	// MessageID is the broker's id of the message.
	MessageID int64
	// Task and Topic name what runs and where it came from.
	Task  string
	Topic string
	// Attempt is 1 for the first run, 2 for the first retry, ...
	Attempt int
	// MaxAttempts is the attempt past which a failure is final.
	MaxAttempts int
	// Headers are the message's headers as submitted (trace context, the
	// schedule that fired it, the plugin that submitted it); do not
	// modify them.
	Headers map[string]string

	mu       sync.Mutex
	logs     []string
	dropped  int
	progress float64
	log      *msgLogger // the attempt's: Logf lines go to its debug log too
}

// Logf adds a line to the attempt's log.
func (tc *TaskContext) Logf(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	tc.mu.Lock()
	if len(tc.logs) < maxLogLines {
		tc.logs = append(tc.logs, line)
	} else {
		tc.dropped++
	}
	log := tc.log
	tc.mu.Unlock()
	if log != nil {
		log.Debug("task log", "line", line)
	}
}

// LogsDropped counts n lines of the attempt's log that were dropped before
// they reached it (a provider plugin's attempt that logged past what one
// attempt keeps): the report counts them with its own.
func (tc *TaskContext) LogsDropped(n int) {
	tc.mu.Lock()
	tc.dropped += n
	tc.mu.Unlock()
}

// Logs returns the lines logged so far (and how many were dropped past the
// limit).
func (tc *TaskContext) Logs() (lines []string, dropped int) {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	return append([]string(nil), tc.logs...), tc.dropped
}

// SetProgress records how far the attempt got, from 0 to 1; values out of
// range are clamped.
func (tc *TaskContext) SetProgress(f float64) {
	if f < 0 || f != f { // f != f: NaN
		f = 0
	}
	if f > 1 {
		f = 1
	}
	tc.mu.Lock()
	tc.progress = f
	tc.mu.Unlock()
}

// Progress returns the last value given to SetProgress.
func (tc *TaskContext) Progress() float64 {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	return tc.progress
}
