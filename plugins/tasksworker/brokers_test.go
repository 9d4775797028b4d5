package tasksworker

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/rabbitmq"
	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/capability/capabilitytest"
	"github.com/taskhost/taskhost/internal/testdb"
	"github.com/taskhost/taskhost/internal/testrabbit"
)

// freshSchema returns a new schema name and drops it when the test ends.
// It fails the test, never skips it, when PostgreSQL does not answer.
func freshSchema(t *testing.T) string {
	t.Helper()
	return testdb.FreshSchema(t, "tw_test_")
}

// TestPluginOnEachBroker runs the same user-visible flow on the stores a
// config can name: a task runs, the topic API answers, and the reclaim
// action runs a real pass (no orphans here, and this worker is live).
func TestPluginOnEachBroker(t *testing.T) {
	configs := map[string]func(t *testing.T) map[string]any{
		"local": func(t *testing.T) map[string]any {
			return map[string]any{"broker": "local", "data_dir": filepath.Join(t.TempDir(), "data")}
		},
		"postgres": func(t *testing.T) map[string]any {
			return map[string]any{"broker": "postgres", "dsn": testdb.DSN(), "schema": freshSchema(t)}
		},
		"rabbitmq": func(t *testing.T) map[string]any {
			return map[string]any{"broker": "rabbitmq", "amqp_url": testrabbit.URL(t), "amqp_prefix": testrabbit.Prefix(),
				"data_dir": filepath.Join(t.TempDir(), "data")}
		},
	}
	for name, cfg := range configs {
		t.Run(name, func(t *testing.T) {
			f := start(t, cfg(t))
			if b, ok := f.plugin.current().broker.(*rabbitmq.Broker); ok {
				// Stopped here first (stopping again is harmless), so that
				// nothing declares the queues again once they are deleted.
				t.Cleanup(func() {
					_ = f.plugin.Stop(context.Background())
					testrabbit.Delete(t, testrabbit.URL(t), b.Queues(), b.Exchanges())
				})
			}
			id := f.submit(`{"task": "demo.echo", "payload": {"n": 7}}`)
			got := f.waitState(id, "done")
			if !jsonEqual(t, got["result"], map[string]any{"n": 7.0}) {
				t.Fatalf("result = %v", got["result"])
			}
			res, err := f.client.InvokeAction(context.Background(), capability.ActionRequest{ActionID: ActionReclaim, Actor: "test"})
			if err != nil {
				t.Fatal(err)
			}
			var out map[string]any
			if err := json.Unmarshal(res.Result, &out); err != nil {
				t.Fatal(err)
			}
			if out["unsupported"] == true || out["skipped"] != nil || out["reclaimed"] != 0.0 {
				t.Fatalf("reclaim on %s = %v (%s), want a pass that ran and found nothing", name, out, res.Message)
			}
			if res.Message != "reclaimed 0, dead-lettered 0, released 0 lock(s)" {
				t.Fatalf("message = %q", res.Message)
			}

			// GET workers says which workers are live, by the broker's clock.
			rt := f.plugin.current()
			rec := rt.broker.(broker.OrphanReclaimer)
			if err := rt.broker.RegisterWorker(context.Background(), broker.WorkerInfo{ID: "gone", Host: "elsewhere", PID: 1}); err != nil {
				t.Fatal(err)
			}
			if err := rec.ExpireWorker(context.Background(), "gone"); err != nil {
				t.Fatal(err)
			}
			live := map[string]any{}
			for _, w := range f.do("GET", "/api/workers", "").json(t)["workers"].([]any) {
				w := w.(map[string]any)
				live[w["id"].(string)] = w["live"]
			}
			if live["gone"] != false || live[rt.pool.WorkerID()] != true || len(live) != 2 {
				t.Fatalf("workers' live flags = %v, want this worker live and gone not", live)
			}
		})
	}
}

// rabbitConfig is a rabbitmq broker's config on prefix, with its local
// state store in a fresh data_dir.
func rabbitConfig(t *testing.T, prefix string) map[string]any {
	return map[string]any{"broker": "rabbitmq", "amqp_url": testrabbit.URL(t), "amqp_prefix": prefix,
		"data_dir": filepath.Join(t.TempDir(), "data")}
}

// startRabbit starts the plugin on the rabbitmq broker of cfg; its
// queues are deleted at cleanup.
func startRabbit(t *testing.T, cfg map[string]any) (*fixture, *rabbitmq.Broker) {
	t.Helper()
	f := start(t, cfg)
	b := f.plugin.current().broker.(*rabbitmq.Broker)
	t.Cleanup(func() {
		_ = f.plugin.Stop(context.Background())
		testrabbit.Delete(t, testrabbit.URL(t), b.Queues(), b.Exchanges())
	})
	return f, b
}

// TestASecondStateStoreOnAPrefixIsAConfigError: a host whose state store
// is not the one that uses its amqp_prefix (two hosts with the default
// state_store: local on one RabbitMQ) does not start: its config is
// refused, naming amqp_prefix, both stores and the fix, so that the host
// shows it as the plugin's error and does not restart it in a loop.
func TestASecondStateStoreOnAPrefixIsAConfigError(t *testing.T) {
	prefix := testrabbit.Prefix()
	startRabbit(t, rabbitConfig(t, prefix))
	p := New(testLogger(t))
	defer p.Stop(context.Background())
	raw, err := json.Marshal(rabbitConfig(t, prefix))
	if err != nil {
		t.Fatal(err)
	}
	err = p.Configure(context.Background(), capability.ConfigureRequest{Config: raw, Host: &capabilitytest.Host{}})
	var bad *capability.InvalidConfigError
	if !errors.As(err, &bad) || bad.Key != "amqp_prefix" {
		t.Fatalf("Configure on another store's prefix: %v; want an invalid amqp_prefix", err)
	}
	for _, want := range []string{strconv.Quote(prefix), "belongs to state store", "own amqp_prefix", "state_store: postgres", "rabbitmqctl delete_queue"} {
		if !strings.Contains(bad.Problem, want) {
			t.Errorf("the refusal does not say %q: %s", want, bad.Problem)
		}
	}
	if h, _ := p.CheckHealth(context.Background()); h.Status != capability.HealthError {
		t.Errorf("health after the refusal = %v", h)
	}
}

// TestRejectedDeliveriesAreCounted: what the rabbitmq broker moves to a
// rejected queue is counted in fastpluggy_broker_deliveries_rejected_total
// by reason: a task of another state store, and a message that is no
// task.
func TestRejectedDeliveriesAreCounted(t *testing.T) {
	prefix := testrabbit.Prefix()
	f, _ := startRabbit(t, rabbitConfig(t, prefix))
	f.waitState(f.submit(`{"task": "demo.echo"}`), "done") // the topic's queue exists
	ch, err := testrabbit.Connect(t).Channel()
	if err != nil {
		t.Fatal(err)
	}
	queue := prefix + ".t.default"
	for _, m := range []amqp.Publishing{
		{Type: "taskhost.message", MessageId: "1", Body: []byte(`{"id":1}`), Headers: amqp.Table{rabbitmq.StoreHeader: "0123456789abcdef"}},
		{Body: []byte("hello")},
	} {
		if err := ch.PublishWithContext(t.Context(), "", queue, false, false, m); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(settle)
	for {
		fams := f.scrape()
		other := value(fams, "fastpluggy_broker_deliveries_rejected_total", "reason", rabbitmq.RejectedOtherStore)
		notTask := value(fams, "fastpluggy_broker_deliveries_rejected_total", "reason", rabbitmq.RejectedNotATask)
		if other == 1 && notTask == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("deliveries rejected: other_store %v, not_a_task %v; want 1 each", other, notTask)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPurgedTasksAreRepublishedAndCounted: tasks whose messages an
// operator purged from their topic queue (here while the topic was
// paused) run once the broker has found them missing, and the plugin's
// series say so: fastpluggy_broker_messages_missing while they are
// missing, fastpluggy_broker_messages_republished_total{reason="missing"}
// once they are published again.
func TestPurgedTasksAreRepublishedAndCounted(t *testing.T) {
	const n = 20
	prefix := testrabbit.Prefix()
	cfg := rabbitConfig(t, prefix)
	cfg["topics"] = map[string]any{"held": map[string]any{"paused": true}}
	f, _ := startRabbit(t, cfg)
	var ids []string
	for range n {
		ids = append(ids, f.submit(`{"task": "demo.echo", "topic": "held"}`))
	}
	ch, err := testrabbit.Connect(t).Channel()
	if err != nil {
		t.Fatal(err)
	}
	if purged, err := ch.QueuePurge(prefix+".t.held", false); err != nil || purged != n {
		t.Fatalf("purge = %d, %v; want the %d messages of the paused topic", purged, err, n)
	}
	if res := f.do("PUT", "/api/topics/held", `{"paused": false}`); res.status != http.StatusOK {
		t.Fatalf("resume: %d %s", res.status, res.body)
	}
	deadline := time.Now().Add(90 * time.Second)
	sawMissing := 0.0
	for {
		fams := f.scrape()
		sawMissing = max(sawMissing, value(fams, "fastpluggy_broker_messages_missing"))
		if value(fams, "fastpluggy_broker_messages_republished_total", "reason", rabbitmq.RepublishedMissing) == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("republished %v of the %d purged messages within 90 s; missing %v",
				value(fams, "fastpluggy_broker_messages_republished_total", "reason", rabbitmq.RepublishedMissing), n,
				value(fams, "fastpluggy_broker_messages_missing"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if sawMissing != n {
		t.Errorf("fastpluggy_broker_messages_missing reached %v before the republish, want %d", sawMissing, n)
	}
	for _, id := range ids {
		if task := f.waitState(id, "done"); task["attempts"] != 1.0 {
			t.Errorf("task %s ran %v times, want once", id, task["attempts"])
		}
	}
}
