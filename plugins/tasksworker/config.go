package tasksworker

// The plugin's config block: its settings, their defaults and strict
// parsing (ParseConfig), and the choice of broker (openBroker).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/postgres"
	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/plugins/tasksworker/service"
	"github.com/taskhost/taskhost/reaper"
)

// DSNEnv is read for the database address when the config's dsn is empty.
const DSNEnv = "TASKHOST_DATABASE_URL"

// Config is the plugin's `config` block, parsed.
type Config struct {
	// Broker is "local" (the default: an embedded SQLite file in DataDir),
	// "memory", "postgres" or "rabbitmq".
	Broker string
	// AMQPURL is the RabbitMQ address of the rabbitmq broker (from
	// AMQPURLEnv when the config has none).
	AMQPURL string
	// AMQPPrefix starts the name of every queue and exchange the rabbitmq
	// broker declares (default "taskhost"): deployments sharing one
	// RabbitMQ virtual host keep apart by it.
	AMQPPrefix string
	// StateStore is where the rabbitmq broker keeps what RabbitMQ cannot
	// hold (workers, topic settings, schedules, reports, the task index):
	// "local" (the default: the local store's file in DataDir) or
	// "postgres" (DSN and Schema).
	StateStore string
	// DataDir is where the local broker keeps its database.
	DataDir string
	// DSN is the PostgreSQL address (from DSNEnv when the config has none).
	DSN string
	// Schema is the PostgreSQL schema holding the tables (default public).
	Schema string
	// Workers is how many tasks run at once in this process.
	Workers int
	// DemoTasks registers demo.crash, a task that kills its own process.
	DemoTasks bool
	// HeartbeatInterval is how often the worker's row is stamped.
	HeartbeatInterval time.Duration
	// DrainTimeout is how long Stop lets running tasks finish.
	DrainTimeout time.Duration
	// MaxPayloadBytes bounds a submitted payload.
	MaxPayloadBytes int
	// Topics are claimed from. Their settings set up a topic the broker
	// does not have yet; a topic that exists keeps the settings stored for
	// it (an operator may have changed them), unless Enforce is set.
	Topics map[string]TopicSetting
	// Reaper holds the orphan_* settings and postgres_worker_ttl_seconds.
	Reaper reaper.Settings
	// Beat makes this process a candidate for the beat (the leader that
	// drives the reaper); default true.
	Beat bool
	// BeatLeaseTTL: a standby takes over within it after the leader dies.
	BeatLeaseTTL time.Duration
	// BeatTick is how often the leader looks for due schedules.
	BeatTick time.Duration
	// Schedules are declared in the config and upserted at start.
	Schedules []service.ScheduleSpec
	// ReportRetention: task reports older than this are purged.
	ReportRetention time.Duration
	// MessageRetention: with the postgres broker, done messages that
	// finished longer ago than this, and schedule fires as old, are
	// purged; 0 keeps them. (The memory and local brokers keep a fixed
	// number of finished messages instead.)
	MessageRetention time.Duration
}

// The config keys, in the order the error messages list them.
var configKeys = []string{
	"broker", "amqp_url", "amqp_prefix", "state_store", "data_dir", "dsn", "schema", "workers", "demo_tasks", "heartbeat_interval_seconds",
	"drain_timeout_seconds", "max_payload_bytes", "topics",
	"orphan_reclaim_enabled", "orphan_reclaim_interval_seconds", "orphan_reclaim_after_seconds",
	"orphan_claim_grace_seconds", "orphan_max_attempts", "postgres_worker_ttl_seconds",
	"beat", "beat_lease_ttl_seconds", "beat_tick_seconds", "schedules", "report_retention_hours",
	"message_retention_hours",
}

var topicKeys = []string{"concurrency_limit", "dead_letter_enabled", "enforce", "paused"}

// TopicSetting is a topic's entry under topics in the config.
type TopicSetting struct {
	broker.TopicPatch
	// Enforce applies the settings at every start, over what is stored;
	// without it they only set up a topic the broker does not have yet.
	Enforce bool
}

// brokerKinds are the broker names a config may use.
var brokerKinds = []string{"memory", "local", "postgres", "rabbitmq"}

// stateStoreKinds are the state stores the rabbitmq broker may use.
var stateStoreKinds = []string{"local", "postgres"}

func defaultConfig() Config {
	return Config{
		Broker:            "local",
		Workers:           8,
		HeartbeatInterval: 5 * time.Second,
		DrainTimeout:      30 * time.Second,
		MaxPayloadBytes:   broker.MaxPayloadSize,
		Topics:            map[string]TopicSetting{},
		Reaper:            reaper.DefaultSettings(),
		Beat:              true,
		BeatLeaseTTL:      15 * time.Second,
		BeatTick:          time.Second,
		ReportRetention:   7 * 24 * time.Hour,
		MessageRetention:  7 * 24 * time.Hour,
	}
}

func invalid(key, format string, args ...any) error {
	return &capability.InvalidConfigError{Key: key, Problem: fmt.Sprintf(format, args...)}
}

// ParseConfig parses the JSON config block strictly: an unknown key or a
// bad value is a *capability.InvalidConfigError naming the key.
func ParseConfig(raw json.RawMessage) (Config, error) {
	cfg := defaultConfig()
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		raw = json.RawMessage("{}")
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return cfg, invalid("", "the config block is not a JSON object (%v); write it as key = value settings, such as workers = 8", err)
	}
	for _, key := range sortedKeys(m) {
		v := m[key]
		var err error
		switch key {
		case "broker":
			cfg.Broker, err = stringSetting(key, v)
			if err == nil && !contains(brokerKinds, cfg.Broker) {
				err = invalid(key, "unknown broker %q; use one of %s", cfg.Broker, strings.Join(brokerKinds, ", "))
			}
		case "amqp_url":
			cfg.AMQPURL, err = stringSetting(key, v)
		case "amqp_prefix":
			cfg.AMQPPrefix, err = stringSetting(key, v)
			if err == nil {
				err = checkAMQPPrefix(cfg.AMQPPrefix, v)
			}
		case "state_store":
			cfg.StateStore, err = stringSetting(key, v)
			if err == nil && !contains(stateStoreKinds, cfg.StateStore) {
				err = invalid(key, "unknown state store %q; use one of %s", cfg.StateStore, strings.Join(stateStoreKinds, ", "))
			}
		case "data_dir":
			cfg.DataDir, err = stringSetting(key, v)
		case "dsn":
			cfg.DSN, err = stringSetting(key, v)
		case "schema":
			cfg.Schema, err = stringSetting(key, v)
		case "workers":
			cfg.Workers, err = intSetting(key, v, 1, 1000)
		case "demo_tasks":
			cfg.DemoTasks, err = boolSetting(key, v)
		case "heartbeat_interval_seconds":
			var s float64
			s, err = secondsSetting(key, v, false)
			cfg.HeartbeatInterval = time.Duration(s * float64(time.Second))
		case "drain_timeout_seconds":
			var s float64
			s, err = secondsSetting(key, v, true)
			cfg.DrainTimeout = time.Duration(s * float64(time.Second))
		case "max_payload_bytes":
			cfg.MaxPayloadBytes, err = intSetting(key, v, 1, broker.MaxPayloadSize)
		case "topics":
			cfg.Topics, err = topicsSetting(v)
		case "orphan_reclaim_enabled":
			cfg.Reaper.Enabled, err = boolSetting(key, v)
		case "orphan_reclaim_interval_seconds":
			cfg.Reaper.Interval, err = durationSetting(key, v, false)
		case "orphan_reclaim_after_seconds":
			cfg.Reaper.After, err = durationSetting(key, v, false)
		case "orphan_claim_grace_seconds":
			cfg.Reaper.Grace, err = durationSetting(key, v, true)
		case "orphan_max_attempts":
			cfg.Reaper.MaxAttempts, err = intSetting(key, v, 1, 1000)
		case "beat":
			cfg.Beat, err = boolSetting(key, v)
		case "beat_lease_ttl_seconds":
			cfg.BeatLeaseTTL, err = durationSetting(key, v, false)
		case "beat_tick_seconds":
			cfg.BeatTick, err = durationSetting(key, v, false)
		case "report_retention_hours":
			var h int
			h, err = intSetting(key, v, 1, 24*366)
			cfg.ReportRetention = time.Duration(h) * time.Hour
		case "message_retention_hours":
			var h int
			h, err = intSetting(key, v, 0, 24*3660)
			cfg.MessageRetention = time.Duration(h) * time.Hour
		case "schedules":
			cfg.Schedules, err = schedulesSetting(v)
		case "postgres_worker_ttl_seconds":
			cfg.Reaper.WorkerTTL, err = durationSetting(key, v, false)
		default:
			err = invalid(key, "unknown setting; the settings are %s", strings.Join(configKeys, ", "))
		}
		if err != nil {
			return cfg, err
		}
	}
	if cfg.DSN == "" {
		cfg.DSN = os.Getenv(DSNEnv)
	}
	if cfg.AMQPURL == "" {
		cfg.AMQPURL = os.Getenv(AMQPURLEnv)
	}
	if err := cfg.Reaper.Validate(cfg.HeartbeatInterval); err != nil {
		return cfg, invalid("", "%v", err)
	}
	if err := checkRabbitMQSettings(&cfg); err != nil {
		return cfg, err
	}
	if cfg.Broker == "postgres" {
		if err := checkPostgresSettings(cfg, "the postgres broker"); err != nil {
			return cfg, err
		}
	}
	if cfg.DataDir == "" {
		cfg.DataDir = "var"
	}
	return cfg, nil
}

// checkPostgresSettings checks dsn and schema for who (the postgres broker,
// or the rabbitmq broker's postgres state store) without connecting, so
// that a value that can never work fails the plugin at once, naming the
// key, instead of being retried as if the database were down.
func checkPostgresSettings(cfg Config, who string) error {
	if cfg.DSN == "" {
		return invalid("dsn", "%s needs a dsn: set dsn (e.g. ${%s}) or the %s environment variable, and pass it with env: [%s] in the host config", who, DSNEnv, DSNEnv, DSNEnv)
	}
	if err := postgres.CheckSchema(cfg.Schema); err != nil {
		return invalid("schema", "%v", strings.TrimPrefix(err.Error(), broker.ErrInvalid.Error()+": "))
	}
	if err := postgres.CheckDSN(cfg.DSN); err != nil {
		return invalid("dsn", "%v", strings.TrimPrefix(err.Error(), broker.ErrInvalid.Error()+": "))
	}
	return nil
}

// schedulesSetting reads the declared schedules strictly; the checks that
// need the task registry run at start.
func schedulesSetting(v json.RawMessage) ([]service.ScheduleSpec, error) {
	var raw []json.RawMessage
	if err := json.Unmarshal(v, &raw); err != nil {
		return nil, invalid("schedules", "must be a list of schedules, such as [%s]", service.ScheduleExample)
	}
	out := make([]service.ScheduleSpec, 0, len(raw))
	names := map[string]bool{}
	for i, r := range raw {
		key := fmt.Sprintf("schedules[%d]", i)
		var b service.ScheduleSpec
		d := json.NewDecoder(bytes.NewReader(r))
		d.DisallowUnknownFields()
		if err := d.Decode(&b); err != nil {
			return nil, invalid(key, "%v; a schedule looks like %s", strings.TrimPrefix(err.Error(), "json: "), service.ScheduleExample)
		}
		if names[b.Name] {
			return nil, invalid(key, "schedule %q is declared twice", b.Name)
		}
		names[b.Name] = true
		out = append(out, b)
	}
	return out, nil
}
