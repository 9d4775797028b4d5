package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/taskhost/taskhost/internal/testdb"
	"github.com/taskhost/taskhost/internal/testrabbit"
	"github.com/taskhost/taskhost/plugins/tasksworker"
)

// TestRabbitMQBench runs the main phases on the rabbitmq broker over a
// postgres state store and checks that every burn-down task has its
// success report there.
func TestRabbitMQBench(t *testing.T) {
	t.Setenv(tasksworker.AMQPURLEnv, testrabbit.URL(t))
	schema := testdb.FreshSchema(t, "tw_bench_")
	cfg := benchConfig{kind: "rabbitmq", dsn: testdb.DSN(), schema: schema, keep: true,
		jobs: 100, workers: 8, limit: 8, rate: 50, duration: 200 * time.Millisecond,
		runs: 1, claimSamples: 1, submitters: 2, submitBatch: 50, timeout: 2 * time.Minute}
	var out strings.Builder
	if err := runBench(context.Background(), cfg, &out); err != nil {
		t.Fatalf("runBench: %v\n%s", err, out.String())
	}
	if sum := summaryOf(t, out.String()); sum["broker"] != "rabbitmq" {
		t.Errorf("summary broker = %v, want rabbitmq", sum["broker"])
	}
	assertReported(t, schema, "bench-%-burn-1", cfg.jobs, false)
}
