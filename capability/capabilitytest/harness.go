// Package capabilitytest runs a plugin value in-process, over the real
// gRPC adapters and go-plugin broker, so plugin code can be tested without
// building a binary or starting a subprocess.
package capabilitytest

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/hashicorp/go-plugin"

	"github.com/taskhost/taskhost/capability"
)

// Connect serves impl over an in-memory go-plugin connection and returns
// the host-side client. The connection is closed when the test ends.
func Connect(t testing.TB, impl capability.Lifecycle) *capability.Client {
	t.Helper()
	c, _ := Dial(t, impl)
	return c
}

// Dial is Connect, and also returns a func that closes the connection at
// once, as when the plugin's process dies: the calls in flight fail. It
// may be called more than once.
func Dial(t testing.TB, impl capability.Lifecycle) (*capability.Client, func()) {
	t.Helper()
	client, server := plugin.TestPluginGRPCConn(t, false, capability.PluginSet(impl))
	var once sync.Once
	closeConn := func() {
		once.Do(func() {
			// Stop the server first: closing the client makes the plugin
			// side stop it too, and two concurrent stops race inside
			// go-plugin.
			server.Stop()
			_ = client.Close()
		})
	}
	t.Cleanup(closeConn)
	c, err := capability.FromRPC(client)
	if err != nil {
		t.Fatalf("capabilitytest: %v", err)
	}
	return c, closeConn
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
	SubmitTasksFunc    func(ctx context.Context, tasks []capability.TaskSubmission) ([]capability.SubmittedTask, error)
	// StreamProviderFunc gives the provider a stream of attempts is
	// relayed to (capability.TaskStreamRelay); nil: no plugin serves the
	// stream, and attempts run one call each (RunTaskFunc).
	StreamProviderFunc func(ctx context.Context, plugin string) (*capability.Client, error)
	// ConnectTasksFunc connects the caller to a provider's own listener of
	// attempts (capability.TaskConnector), as with
	// Client.OpenTaskListener; nil: streams of attempts are relayed
	// (StreamProviderFunc).
	ConnectTasksFunc func(ctx context.Context, plugin string, clientCert []byte) (capability.TaskListener, error)
}

var (
	_ capability.TaskStreamRelay = (*Host)(nil)
	_ capability.TaskConnector   = (*Host)(nil)
)

// ConnectTasks implements capability.TaskConnector.
func (h *Host) ConnectTasks(ctx context.Context, plugin string, clientCert []byte) (capability.TaskListener, error) {
	if h.ConnectTasksFunc == nil {
		return capability.TaskListener{}, fmt.Errorf("plugin %q is not connected directly: %w", plugin, capability.ErrUnimplemented)
	}
	return h.ConnectTasksFunc(ctx, plugin, clientCert)
}

// StreamProvider implements capability.TaskStreamRelay.
func (h *Host) StreamProvider(ctx context.Context, plugin string) (*capability.Client, error) {
	if h.StreamProviderFunc == nil {
		return nil, fmt.Errorf("plugin %q serves no stream of attempts: %w", plugin, capability.ErrUnimplemented)
	}
	return h.StreamProviderFunc(ctx, plugin)
}

// HostServices serves host over the real gRPC adapters and go-plugin
// broker, as the host serves its services, and returns what a plugin gets
// in Configure: a client of them. The connection is closed when the test
// ends.
func HostServices(t testing.TB, host capability.HostServices) capability.HostServices {
	t.Helper()
	got := &hostCatcher{}
	Start(t, got, nil, host)
	return got.host
}

// hostCatcher is a plugin that keeps the host services Configure gives it.
type hostCatcher struct{ host capability.HostServices }

func (h *hostCatcher) Describe(context.Context) (capability.Description, error) {
	return capability.Description{Name: "caller", Version: "test"}, nil
}
func (h *hostCatcher) Configure(_ context.Context, req capability.ConfigureRequest) error {
	h.host = req.Host
	return nil
}
func (h *hostCatcher) CheckHealth(context.Context) (capability.Health, error) {
	return capability.Health{Status: capability.HealthOK}, nil
}
func (h *hostCatcher) Stop(context.Context) error { return nil }

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

// SubmitTasks implements capability.HostServices; a nil SubmitTasksFunc
// answers capability.ErrUnavailable, as a host whose task system does not
// run.
func (h *Host) SubmitTasks(ctx context.Context, tasks []capability.TaskSubmission) ([]capability.SubmittedTask, error) {
	if h.SubmitTasksFunc == nil {
		return nil, capability.ErrUnavailable
	}
	return h.SubmitTasksFunc(ctx, tasks)
}
