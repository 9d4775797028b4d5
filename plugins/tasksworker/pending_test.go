package tasksworker

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/capability/capabilitytest"
	"github.com/taskhost/taskhost/worker"
)

// TestPendingProviders: during the grace, the plugins that may still
// register tasks are those starting or waiting for a restart whose tasks
// were never listed; one listed once stays off the list when it restarts;
// a failed one is not waited for; after the grace none is.
func TestPendingProviders(t *testing.T) {
	var mu sync.Mutex
	states := map[string]string{"a": "starting", "b": "backoff", "c": "failed", "d": "running", "e": "running"}
	host := &capabilitytest.Host{
		ListPluginsFunc: func(context.Context, capability.Capability) ([]capability.PluginInfo, error) {
			mu.Lock()
			defer mu.Unlock()
			var out []capability.PluginInfo
			for _, name := range []string{"a", "b", "c", "d", "e"} {
				out = append(out, capability.PluginInfo{Name: name, State: states[name]})
			}
			return out, nil
		},
		ListTasksFunc: func(_ context.Context, plugin string) ([]capability.TaskSpec, error) {
			if plugin == "e" {
				return nil, capability.ErrUnavailable
			}
			return []capability.TaskSpec{{Name: plugin + ".task"}}, nil
		},
	}
	reg := worker.NewRegistry()
	ps := newProviderSet(host, capability.NewTaskRunner(host, capability.TaskRunnerOptions{}), reg, testLogger(t).Named("providers"), time.Hour)
	ctx := context.Background()
	if got := ps.Pending(ctx); !slices.Equal(got, []string{"a", "b", "e"}) {
		t.Fatalf("pending = %v, want a (starting), b (backoff), e (its list failed)", got)
	}
	if _, ok := reg.Lookup("d.task"); !ok {
		t.Fatal("the running provider's task was not registered by the discovery Pending ran")
	}

	mu.Lock()
	states["a"], states["d"] = "running", "backoff"
	mu.Unlock()
	ps.mu.Lock()
	ps.at = time.Time{} // as if the last discovery were old
	ps.mu.Unlock()
	if got := ps.Pending(ctx); !slices.Equal(got, []string{"b", "e"}) {
		t.Fatalf("pending = %v, want b and e: a is listed now, d was listed before it restarted", got)
	}
	if _, ok := reg.Lookup("a.task"); !ok {
		t.Fatal("a's task was not registered")
	}

	ps.until = time.Now()
	if got := ps.Pending(ctx); got != nil {
		t.Fatalf("after the grace: pending = %v, want none", got)
	}
	if got := (*providerSet)(nil).Pending(ctx); got != nil {
		t.Fatalf("no provider set: %v", got)
	}
}
