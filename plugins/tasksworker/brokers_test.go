package tasksworker

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/rabbitmq"
	"github.com/taskhost/taskhost/capability"
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
