package tasksworker

// Reading one config value strictly: strings, booleans, numbers, durations
// and the topics map, each refused with a message naming its key.

import (
	"bytes"
	"encoding/json"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/taskhost/taskhost/broker"
)

func durationSetting(key string, v json.RawMessage, zeroOK bool) (time.Duration, error) {
	s, err := secondsSetting(key, v, zeroOK)
	return time.Duration(s * float64(time.Second)), err
}

func stringSetting(key string, v json.RawMessage) (string, error) {
	var s *string
	if err := json.Unmarshal(v, &s); err != nil {
		return "", invalid(key, "must be a string, got %s", clip(v))
	}
	if s == nil {
		return "", nil
	}
	return *s, nil
}

func boolSetting(key string, v json.RawMessage) (bool, error) {
	var b bool
	if err := json.Unmarshal(v, &b); err != nil {
		return false, invalid(key, "must be true or false, got %s", clip(v))
	}
	return b, nil
}

func number(v json.RawMessage) (json.Number, bool) {
	d := json.NewDecoder(bytes.NewReader(v))
	d.UseNumber()
	var n any
	if err := d.Decode(&n); err != nil {
		return "", false
	}
	num, ok := n.(json.Number)
	return num, ok
}

func intSetting(key string, v json.RawMessage, lo, hi int) (int, error) {
	num, ok := number(v)
	i, err := strconv.ParseInt(string(num), 10, 64)
	if !ok || err != nil || i < int64(lo) || i > int64(hi) {
		return 0, invalid(key, "must be a whole number from %d to %d, got %s", lo, hi, clip(v))
	}
	return int(i), nil
}

func secondsSetting(key string, v json.RawMessage, zeroOK bool) (float64, error) {
	const maxSeconds = 7 * 24 * 3600
	num, ok := number(v)
	f, err := strconv.ParseFloat(string(num), 64)
	bad := !ok || err != nil || math.IsNaN(f) || f < 0 || f > maxSeconds || (f == 0 && !zeroOK)
	if bad {
		if zeroOK {
			return 0, invalid(key, "must be a number of seconds from 0 to %d, got %s", maxSeconds, clip(v))
		}
		return 0, invalid(key, "must be a number of seconds above 0 and at most %d, got %s", maxSeconds, clip(v))
	}
	return f, nil
}

func topicsSetting(v json.RawMessage) (map[string]TopicSetting, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(v, &m); err != nil {
		return nil, invalid("topics", "must be a map from topic name to {%s}, got %s", strings.Join(topicKeys, ", "), clip(v))
	}
	out := make(map[string]TopicSetting, len(m))
	for _, name := range sortedKeys(m) {
		key := "topics." + name
		if err := broker.ValidateTopicName(name); err != nil {
			return nil, invalid(key, "bad topic name: %v", err)
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(m[name], &fields); err != nil {
			return nil, invalid(key, "must be an object with %s, got %s", strings.Join(topicKeys, ", "), clip(m[name]))
		}
		var p TopicSetting
		for _, f := range sortedKeys(fields) {
			fk := key + "." + f
			switch f {
			case "concurrency_limit":
				n, err := intSetting(fk, fields[f], 0, broker.MaxConcurrencyLimit)
				if err != nil {
					return nil, invalid(fk, "must be a whole number from 0 (unlimited) to %d, got %s", broker.MaxConcurrencyLimit, clip(fields[f]))
				}
				p.ConcurrencyLimit = &n
			case "dead_letter_enabled":
				b, err := boolSetting(fk, fields[f])
				if err != nil {
					return nil, err
				}
				p.DeadLetterEnabled = &b
			case "paused":
				b, err := boolSetting(fk, fields[f])
				if err != nil {
					return nil, err
				}
				p.Paused = &b
			case "enforce":
				b, err := boolSetting(fk, fields[f])
				if err != nil {
					return nil, err
				}
				p.Enforce = b
			default:
				return nil, invalid(fk, "unknown topic setting; the settings are %s", strings.Join(topicKeys, ", "))
			}
		}
		out[name] = p
	}
	return out, nil
}

// clip shows a bad value in a message without flooding it.
func clip(v json.RawMessage) string {
	s := string(bytes.TrimSpace(v))
	if len(s) > 60 {
		s = s[:60] + "..."
	}
	return s
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
