// Package capabilitytest runs a plugin value in-process, over the real
// gRPC adapters and go-plugin broker, so plugin code can be tested without
// building a binary or starting a subprocess.
package capabilitytest

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/hashicorp/go-plugin"

	"github.com/taskhost/taskhost/capability"
)

// Connect serves impl over an in-memory go-plugin connection and returns
// the host-side client. The connection is closed when the test ends.
func Connect(t testing.TB, impl capability.Lifecycle) *capability.Client {
	t.Helper()
	client, server := plugin.TestPluginGRPCConn(t, false, capability.PluginSet(impl))
	t.Cleanup(func() {
		// Stop the server first: closing the client makes the plugin side
		// stop it too, and two concurrent stops race inside go-plugin.
		server.Stop()
		_ = client.Close()
	})
	c, err := capability.FromRPC(client)
	if err != nil {
		t.Fatalf("capabilitytest: %v", err)
	}
	return c
}

// Start connects impl and configures it with config (any JSON-marshalable
// value, nil for "{}") and host services host (nil for Host{}).
func Start(t testing.TB, impl capability.Lifecycle, config any, host capability.HostServices) *capability.Client {
	t.Helper()
	c := Connect(t, impl)
	raw := json.RawMessage("{}")
	if config != nil {
		b, err := json.Marshal(config)
		if err != nil {
			t.Fatalf("capabilitytest: marshal config: %v", err)
		}
		raw = b
	}
	if host == nil {
		host = &Host{}
	}
	if err := c.Configure(context.Background(), capability.ConfigureRequest{Config: raw, Host: host, HostVersion: "test"}); err != nil {
		t.Fatalf("capabilitytest: configure: %v", err)
	}
	t.Cleanup(func() { _ = impl.Stop(context.Background()) })
	return c
}

// Host is a HostServices for tests: each call goes to the matching func
// field, and a nil field answers capability.ErrNotFound.
type Host struct {
	ListPluginsFunc    func(ctx context.Context, c capability.Capability) ([]capability.PluginInfo, error)
	CollectMetricsFunc func(ctx context.Context, plugin string) (capability.MetricsPayload, error)
	RunTaskFunc        func(ctx context.Context, plugin string, run capability.TaskRun, events capability.TaskEvents) (json.RawMessage, error)
	ListTasksFunc      func(ctx context.Context, plugin string) ([]capability.TaskSpec, error)
}

// ListTasks implements capability.HostServices.
func (h *Host) ListTasks(ctx context.Context, plugin string) ([]capability.TaskSpec, error) {
	if h.ListTasksFunc == nil {
		return nil, capability.ErrNotFound
	}
	return h.ListTasksFunc(ctx, plugin)
}

// ListPlugins implements capability.HostServices.
func (h *Host) ListPlugins(ctx context.Context, c capability.Capability) ([]capability.PluginInfo, error) {
	if h.ListPluginsFunc == nil {
		return nil, nil
	}
	return h.ListPluginsFunc(ctx, c)
}

// CollectMetrics implements capability.HostServices.
func (h *Host) CollectMetrics(ctx context.Context, plugin string) (capability.MetricsPayload, error) {
	if h.CollectMetricsFunc == nil {
		return capability.MetricsPayload{}, capability.ErrNotFound
	}
	return h.CollectMetricsFunc(ctx, plugin)
}

// RunTask implements capability.HostServices.
func (h *Host) RunTask(ctx context.Context, plugin string, run capability.TaskRun, events capability.TaskEvents) (json.RawMessage, error) {
	if h.RunTaskFunc == nil {
		return nil, capability.ErrNotFound
	}
	return h.RunTaskFunc(ctx, plugin, run, events)
}
