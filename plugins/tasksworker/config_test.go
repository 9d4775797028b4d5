package tasksworker

// Tests of the config's parsing.

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/capability/capabilitytest"
)

func TestInvalidConfig(t *testing.T) {
	t.Setenv(DSNEnv, "")
	t.Setenv(AMQPURLEnv, "")
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
		{"topic negative limit", `{"topics": {"a": {"concurrency_limit": -1}}}`, "topics.a.concurrency_limit", "from 0 (unlimited) to 2147483647"},
		{"topic limit over 32 bits", `{"topics": {"a": {"concurrency_limit": 3000000000}}}`, "topics.a.concurrency_limit", "from 0 (unlimited) to 2147483647"},
		{"topic unknown key", `{"topics": {"a": {"limit": 1}}}`, "topics.a.limit", "unknown topic setting"},
		{"topic bad paused", `{"topics": {"a": {"paused": 1}}}`, "topics.a.paused", "true or false"},
		{"negative message retention", `{"message_retention_hours": -1}`, "message_retention_hours", "from 0"},
		{"message retention not a number", `{"message_retention_hours": "week"}`, "message_retention_hours", "whole number"},
		{"not an object", `[1]`, "", "not a JSON object"},
		{"rabbitmq broker without amqp_url", `{"broker": "rabbitmq"}`, "amqp_url", "the rabbitmq broker needs amqp_url"},
		{"amqp_url of another scheme", `{"broker": "rabbitmq", "amqp_url": "http://guest:guest@127.0.0.1:5672/"}`, "amqp_url", "the address does not parse"},
		{"amqp_url with a bad port", `{"broker": "rabbitmq", "amqp_url": "amqp://guest:guest@127.0.0.1:notaport/"}`, "amqp_url", "the address does not parse"},
		{"amqp_url not a string", `{"broker": "rabbitmq", "amqp_url": 5672}`, "amqp_url", "must be a string"},
		{"unknown state store", `{"broker": "rabbitmq", "amqp_url": "amqp://127.0.0.1/", "state_store": "redis"}`, "state_store", "unknown state store"},
		{"postgres state store without dsn", `{"broker": "rabbitmq", "amqp_url": "amqp://127.0.0.1/", "state_store": "postgres"}`, "dsn", "the rabbitmq broker's postgres state store needs a dsn"},
		{"postgres state store with a bad schema", `{"broker": "rabbitmq", "amqp_url": "amqp://127.0.0.1/", "state_store": "postgres", "dsn": "postgres://u@127.0.0.1/db", "schema": "a b"}`, "schema", "letters, digits and underscores"},
		{"amqp_prefix with a dot", `{"broker": "rabbitmq", "amqp_url": "amqp://127.0.0.1/", "amqp_prefix": "a.b"}`, "amqp_prefix", "letters, digits"},
		{"empty amqp_prefix", `{"broker": "rabbitmq", "amqp_url": "amqp://127.0.0.1/", "amqp_prefix": ""}`, "amqp_prefix", "letters, digits"},
		{"amqp_prefix on another broker", `{"broker": "local", "amqp_prefix": "x"}`, "amqp_prefix", "only the rabbitmq broker"},
		{"state store on another broker", `{"broker": "postgres", "dsn": "postgres://u@127.0.0.1/db", "state_store": "local"}`, "state_store", "only the rabbitmq broker has a state store"},
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

func TestRabbitMQSettings(t *testing.T) {
	t.Setenv(AMQPURLEnv, "amqp://guest:guest@127.0.0.1:5672/from-env")
	cfg, err := ParseConfig(json.RawMessage(`{"broker": "rabbitmq", "orphan_max_attempts": 3}`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.AMQPURL != "amqp://guest:guest@127.0.0.1:5672/from-env" || cfg.StateStore != "local" || cfg.Reaper.MaxAttempts != 3 {
		t.Errorf("amqp_url %q, state_store %q, orphan_max_attempts %d; want the environment's URL, local, 3", cfg.AMQPURL, cfg.StateStore, cfg.Reaper.MaxAttempts)
	}
	cfg, err = ParseConfig(json.RawMessage(`{"broker": "rabbitmq", "amqp_url": "amqps://u:p@mq.example:5671/prod", "state_store": "postgres", "dsn": "postgres://u@127.0.0.1/db", "schema": "tasks", "amqp_prefix": "prod-1"}`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.AMQPURL != "amqps://u:p@mq.example:5671/prod" || cfg.StateStore != "postgres" || cfg.Schema != "tasks" || cfg.AMQPPrefix != "prod-1" {
		t.Errorf("parsed = %+v", cfg)
	}
	// The URL may hold a password: a refusal never repeats it.
	_, err = ParseConfig(json.RawMessage(`{"broker": "rabbitmq", "amqp_url": "amqp://guest:s3cret@127.0.0.1:bad/"}`))
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("bad URL with a password: %v", err)
	}
}

// TestRabbitMQUnreachable: a RabbitMQ that does not answer fails the
// start with a message saying so and how to start it, without the
// password of the URL.
func TestRabbitMQUnreachable(t *testing.T) {
	p := New(testLogger(t))
	defer p.Stop(context.Background())
	cfg := `{"broker": "rabbitmq", "amqp_url": "amqp://guest:s3cret@127.0.0.1:1/", "data_dir": ` + strconv.Quote(t.TempDir()) + `}`
	err := p.Configure(context.Background(), capability.ConfigureRequest{Config: json.RawMessage(cfg), Host: &capabilitytest.Host{}})
	if err == nil || !strings.Contains(err.Error(), "is RabbitMQ running?") || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("Configure with no RabbitMQ: %v; want an error saying RabbitMQ does not answer, without the password", err)
	}
	if h, _ := p.CheckHealth(context.Background()); h.Status != capability.HealthError {
		t.Errorf("health after a failed start = %v", h)
	}
}
