package host

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"
)

// A plugin's stderr is its log: JSON lines in hclog's format, or plain
// text. go-plugin parses those lines itself, and its parser panics on a
// JSON line whose "@message", "@level" or "@timestamp" is not a string;
// that panic is in a goroutine of the host, so one bad line from any
// plugin, in any language, would end the host and every plugin with it.
// So the host switches go-plugin's parser off (goPluginLogger gives it a
// logger that is off for the plugin's stderr) and reads the lines itself
// (stderrLog), as go-plugin would have, without ever panicking.

// goPluginLogger is the logger go-plugin gets for a plugin launched by
// cmd: log itself, except for the logger go-plugin names after the
// binary to log the plugin's stderr, which is off.
func goPluginLogger(log hclog.Logger, cmdPath string) hclog.Logger {
	return &stderrOff{Logger: log, binary: filepath.Base(cmdPath)}
}

type stderrOff struct {
	hclog.Logger
	binary string
}

var offLogger = hclog.New(&hclog.LoggerOptions{Level: hclog.Off, Output: io.Discard})

func (l *stderrOff) Named(name string) hclog.Logger {
	if name == l.binary {
		return offLogger
	}
	return l.Logger.Named(name)
}

// maxLogLine bounds a line stderrLog keeps before logging it (go-plugin's
// own buffer for a line is 64 KiB): a longer line is logged in pieces, as
// text.
const maxLogLine = 64 << 10

// stderrLog logs the lines written to it, a plugin's stderr, to log: a
// JSON line at its "@level" with its message and fields, a text line at
// the level its "[LEVEL]" prefix names (DEBUG without one), and the lines
// of a Go panic or fatal error at ERROR.
type stderrLog struct {
	log     hclog.Logger
	mu      sync.Mutex
	line    []byte
	inPanic bool
}

func newStderrLog(log hclog.Logger) *stderrLog { return &stderrLog{log: log} }

func (w *stderrLog) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 || len(w.line)+i > maxLogLine {
			// No end of line, or not within the bound: keep what fits,
			// and log it as a piece once the bound is reached.
			k := min(len(p), maxLogLine-len(w.line))
			w.line = append(w.line, p[:k]...)
			p = p[k:]
			if len(w.line) >= maxLogLine {
				w.logLine(w.line, false)
				w.line = w.line[:0]
			}
			continue
		}
		w.line = append(w.line, p[:i]...)
		w.logLine(w.line, true)
		w.line = w.line[:0]
		p = p[i+1:]
	}
	return n, nil
}

// logLine logs one line; whole is false for a piece of a line too long to
// keep, which is logged as text.
func (w *stderrLog) logLine(line []byte, whole bool) {
	if len(line) == 0 {
		return
	}
	if whole {
		if msg, level, args, ok := parseLogJSON(line); ok {
			if level == hclog.NoLevel {
				// JSON, but not hclog's: log it as it is.
				w.log.Debug(string(line))
				return
			}
			w.log.Log(level, msg, args...)
			return
		}
	}
	text := string(line)
	switch {
	case strings.HasPrefix(text, "[TRACE]"):
		w.log.Trace(text)
	case strings.HasPrefix(text, "[DEBUG]"):
		w.log.Debug(text)
	case strings.HasPrefix(text, "[INFO]"):
		w.log.Info(text)
	case strings.HasPrefix(text, "[WARN]"):
		w.log.Warn(text)
	case strings.HasPrefix(text, "[ERROR]"):
		w.log.Error(text)
	case strings.HasPrefix(text, "panic: ") || strings.HasPrefix(text, "fatal error: "):
		w.inPanic = true
		w.log.Error(text)
	case w.inPanic:
		w.log.Error(text)
	default:
		w.log.Debug(text)
	}
}

// parseLogJSON reads an hclog JSON line: its message, level and the other
// fields as key-value arguments (the timestamp among them). Fields of the
// wrong type are kept as fields rather than refused: a plugin that writes
// {"@message": 5} gets its line logged, not lost. ok is false when the
// line is not a JSON object; level is NoLevel when it names no known
// level.
func parseLogJSON(line []byte) (msg string, level hclog.Level, args []any, ok bool) {
	var raw map[string]any
	if err := json.Unmarshal(line, &raw); err != nil {
		return "", hclog.NoLevel, nil, false
	}
	level = hclog.NoLevel
	if s, isString := raw["@level"].(string); isString {
		level = hclog.LevelFromString(s)
		delete(raw, "@level")
	}
	if v, has := raw["@message"]; has {
		if s, isString := v.(string); isString {
			msg = s
		} else {
			msg = fmt.Sprint(v)
		}
		delete(raw, "@message")
	}
	if v, has := raw["@timestamp"]; has {
		raw["timestamp"] = v
		delete(raw, "@timestamp")
	}
	for _, k := range slices.Sorted(maps.Keys(raw)) {
		args = append(args, k, raw[k])
	}
	return msg, level, args, true
}
