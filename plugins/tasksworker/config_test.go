package tasksworker

// Tests of the config's parsing.

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/capability/capabilitytest"
)

func TestInvalidConfig(t *testing.T) {
	t.Setenv(DSNEnv, "")
	t.Chdir(t.TempDir()) // configs that get as far as the default local store write in ./var
	cases := []struct {
		name, config, key, problem string
	}{
		{"unknown key", `{"worker": 8}`, "worker", "unknown setting"},
		{"workers zero", `{"workers": 0}`, "workers", "from 1 to 1000"},
		{"workers too many", `{"workers": 1001}`, "workers", "from 1 to 1000"},
		{"workers fraction", `{"workers": 2.5}`, "workers", "whole number"},
		{"workers string", `{"workers": "8"}`, "workers", "whole number"},
		{"postgres broker without dsn", `{"broker": "postgres"}`, "dsn", "the postgres broker needs a dsn"},
		{"dsn that does not parse", `{"broker": "postgres", "dsn": "not a dsn"}`, "dsn", "the dsn does not parse"},
		{"dsn with a bad sslmode", `{"broker": "postgres", "dsn": "postgres://u@127.0.0.1/db?sslmode=bogus"}`, "dsn", "the dsn does not parse"},
		{"schema that is not a name", `{"broker": "postgres", "dsn": "postgres://u@127.0.0.1/db", "schema": "bad; drop table x"}`, "schema", "letters, digits and underscores"},
		{"reaper after under two heartbeats", `{"heartbeat_interval_seconds": 5, "orphan_reclaim_after_seconds": 9}`, "", "at least two heartbeat intervals"},
		{"negative grace", `{"orphan_claim_grace_seconds": -1}`, "orphan_claim_grace_seconds", "from 0"},
		{"zero max attempts", `{"orphan_max_attempts": 0}`, "orphan_max_attempts", "from 1"},
		{"reaper enabled not bool", `{"orphan_reclaim_enabled": "no"}`, "orphan_reclaim_enabled", "true or false"},
		{"unknown broker", `{"broker": "kafka"}`, "broker", "unknown broker"},
		{"broker not a string", `{"broker": 1}`, "broker", "must be a string"},
		{"zero heartbeat", `{"heartbeat_interval_seconds": 0}`, "heartbeat_interval_seconds", "above 0"},
		{"negative drain", `{"drain_timeout_seconds": -1}`, "drain_timeout_seconds", "from 0"},
		{"zero payload limit", `{"max_payload_bytes": 0}`, "max_payload_bytes", "from 1"},
		{"demo_tasks not bool", `{"demo_tasks": "yes"}`, "demo_tasks", "true or false"},
		{"data_dir not string", `{"data_dir": 3}`, "data_dir", "must be a string"},
		{"topics not a map", `{"topics": []}`, "topics", "must be a map"},
		{"topic negative limit", `{"topics": {"a": {"concurrency_limit": -1}}}`, "topics.a.concurrency_limit", "0 for unlimited"},
		{"topic unknown key", `{"topics": {"a": {"limit": 1}}}`, "topics.a.limit", "unknown topic setting"},
		{"topic bad paused", `{"topics": {"a": {"paused": 1}}}`, "topics.a.paused", "true or false"},
		{"negative message retention", `{"message_retention_hours": -1}`, "message_retention_hours", "from 0"},
		{"message retention not a number", `{"message_retention_hours": "week"}`, "message_retention_hours", "whole number"},
		{"not an object", `[1]`, "", "not a JSON object"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := New(testLogger(t))
			defer p.Stop(context.Background())
			err := p.Configure(context.Background(), capability.ConfigureRequest{Config: json.RawMessage(tc.config), Host: &capabilitytest.Host{}})
			var ice *capability.InvalidConfigError
			if !errors.As(err, &ice) {
				t.Fatalf("error %v (%T), want *capability.InvalidConfigError", err, err)
			}
			if ice.Key != tc.key || !strings.Contains(ice.Problem, tc.problem) {
				t.Errorf("got key %q problem %q; want key %q and a problem saying %q", ice.Key, ice.Problem, tc.key, tc.problem)
			}
			if h, _ := p.CheckHealth(context.Background()); h.Status != capability.HealthError {
				t.Errorf("health after a refused config = %v", h)
			}
		})
	}

	// Over gRPC the host still sees an InvalidConfigError.
	c := capabilitytest.Connect(t, New(testLogger(t)))
	err := c.Configure(context.Background(), capability.ConfigureRequest{Config: json.RawMessage(`{"workers": -3}`), Host: &capabilitytest.Host{}})
	var ice *capability.InvalidConfigError
	if !errors.As(err, &ice) || !strings.Contains(ice.Error(), "workers") {
		t.Errorf("over gRPC: %v", err)
	}
}

func TestParseConfigDefaults(t *testing.T) {
	t.Setenv(DSNEnv, "postgres://from-env")
	cfg, err := ParseConfig(json.RawMessage(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Broker != "local" || cfg.DataDir != "var" || cfg.Workers != 8 || cfg.HeartbeatInterval != 5*time.Second || cfg.DrainTimeout != 30*time.Second ||
		cfg.MaxPayloadBytes != 1048576 || cfg.DemoTasks || cfg.DSN != "postgres://from-env" {
		t.Errorf("defaults = %+v", cfg)
	}
	cfg, err = ParseConfig(json.RawMessage(`{"dsn": "postgres://mine", "heartbeat_interval_seconds": 0.5, "drain_timeout_seconds": 0, "data_dir": "/var/lib/x", "topics": {"t": {"paused": true}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.DSN != "postgres://mine" || cfg.HeartbeatInterval != 500*time.Millisecond || cfg.DrainTimeout != 0 || cfg.DataDir != "/var/lib/x" ||
		cfg.Topics["t"].Paused == nil || !*cfg.Topics["t"].Paused || cfg.Topics["t"].ConcurrencyLimit != nil {
		t.Errorf("parsed = %+v", cfg)
	}
}

func TestMessageRetentionSetting(t *testing.T) {
	cfg, err := ParseConfig(json.RawMessage(`{}`))
	if err != nil || cfg.MessageRetention != 7*24*time.Hour {
		t.Fatalf("default message retention = %v, %v; want 168h", cfg.MessageRetention, err)
	}
	cfg, err = ParseConfig(json.RawMessage(`{"message_retention_hours": 0}`))
	if err != nil || cfg.MessageRetention != 0 {
		t.Fatalf("message_retention_hours 0 = %v, %v; want 0 (keep)", cfg.MessageRetention, err)
	}
	cfg, err = ParseConfig(json.RawMessage(`{"message_retention_hours": 24}`))
	if err != nil || cfg.MessageRetention != 24*time.Hour {
		t.Fatalf("message_retention_hours 24 = %v, %v", cfg.MessageRetention, err)
	}
}
