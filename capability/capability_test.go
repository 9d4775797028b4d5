package capability_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/capability/capabilitytest"
)

// lifecycleOnly implements nothing but Lifecycle.
type lifecycleOnly struct {
	mu      sync.Mutex
	host    capability.HostServices
	config  json.RawMessage
	stopped int
	badCfg  bool
}

func (p *lifecycleOnly) Describe(context.Context) (capability.Description, error) {
	return capability.Description{Name: "plain", Version: "1.2.3"}, nil
}

func (p *lifecycleOnly) Configure(_ context.Context, req capability.ConfigureRequest) error {
	if p.badCfg {
		return &capability.InvalidConfigError{Key: "workers", Problem: "must be positive"}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.host, p.config = req.Host, req.Config
	return nil
}

func (p *lifecycleOnly) CheckHealth(context.Context) (capability.Health, error) {
	return capability.Health{Status: capability.HealthDegraded, Message: "half"}, nil
}

func (p *lifecycleOnly) Stop(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopped++
	return nil
}

// full implements every capability.
type full struct {
	lifecycleOnly
}

func (p *full) CollectMetrics(context.Context) (capability.MetricsPayload, error) {
	return capability.MetricsPayload{Body: []byte("x 1\n"), Format: "text/plain; version=0.0.4"}, nil
}

func (p *full) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/echo":
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("X-Seen-Query", r.URL.RawQuery)
		w.Header().Set("X-Seen-Actor", r.Header.Get("X-Taskhost-Actor"))
		w.WriteHeader(http.StatusTeapot)
		fmt.Fprintf(w, "%s %s", r.Method, body)
	case "/big":
		// Larger than one chunk, written in several pieces.
		for i := 0; i < 100; i++ {
			_, _ = w.Write([]byte(strings.Repeat("a", 1000)))
		}
	case "/stream":
		for i := 0; i < 3; i++ {
			fmt.Fprintf(w, "event %d\n", i)
			w.(http.Flusher).Flush()
		}
	case "/empty":
		w.WriteHeader(http.StatusNoContent)
	default:
		http.NotFound(w, r)
	}
}

func (p *full) ListActions(context.Context) ([]capability.ActionSpec, error) {
	return []capability.ActionSpec{{ID: "go", Title: "Go", Confirm: true, TimeoutSeconds: 5}}, nil
}

func (p *full) InvokeAction(_ context.Context, req capability.ActionRequest) (capability.ActionResult, error) {
	switch req.ActionID {
	case "go":
		return capability.ActionResult{Message: "went as " + req.Actor, Result: json.RawMessage(`{"n":1}`)}, nil
	case "bad":
		return capability.ActionResult{}, &capability.InvalidArgumentError{Msg: "bad params"}
	}
	return capability.ActionResult{}, fmt.Errorf("action %q: %w", req.ActionID, capability.ErrNotFound)
}

func (p *full) SubmitTasks(_ context.Context, plugin string, tasks []capability.TaskSubmission) ([]capability.SubmittedTask, error) {
	out := make([]capability.SubmittedTask, len(tasks))
	for i, t := range tasks {
		out[i] = capability.SubmittedTask{ID: plugin + ":" + t.Task}
	}
	return out, nil
}

func (p *full) ListTasks(context.Context) ([]capability.TaskSpec, error) {
	return []capability.TaskSpec{{Name: "t.add", Topic: "math", MaxAttempts: 2}}, nil
}

func (p *full) RunTask(_ context.Context, run capability.TaskRun, ev capability.TaskEvents) (json.RawMessage, error) {
	ev.Log("starting " + run.Task)
	ev.Progress(0.5)
	if run.Task == "t.fail" {
		return nil, errors.New("boom")
	}
	return run.Payload, nil
}

type recorder struct {
	mu       sync.Mutex
	logs     []string
	progress []float64
}

func (r *recorder) Log(l string) { r.mu.Lock(); r.logs = append(r.logs, l); r.mu.Unlock() }
func (r *recorder) Progress(f float64) {
	r.mu.Lock()
	r.progress = append(r.progress, f)
	r.mu.Unlock()
}

func TestDescribeReportsOnlyImplementedCapabilities(t *testing.T) {
	ctx := context.Background()
	plain := capabilitytest.Connect(t, &lifecycleOnly{})
	d, err := plain.Describe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d.Name != "plain" || d.Version != "1.2.3" || d.PID == 0 {
		t.Fatalf("describe = %+v", d)
	}
	if len(d.Capabilities) != 1 || d.Capabilities[0] != capability.Lifecycles {
		t.Fatalf("capabilities = %v, want [lifecycle]", d.Capabilities)
	}
	if len(d.APIVersions) != 1 || d.APIVersions[0] != capability.ProtocolVersion {
		t.Fatalf("api versions = %v", d.APIVersions)
	}
	// Services that are not implemented answer ErrUnimplemented.
	if _, err := plain.CollectMetrics(ctx); !errors.Is(err, capability.ErrUnimplemented) {
		t.Fatalf("collect metrics on plain plugin: %v, want ErrUnimplemented", err)
	}
	if _, err := plain.ListActions(ctx); !errors.Is(err, capability.ErrUnimplemented) {
		t.Fatalf("list actions on plain plugin: %v, want ErrUnimplemented", err)
	}

	all := capabilitytest.Connect(t, &full{})
	d, err = all.Describe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range capability.AllCapabilities {
		if !d.Has(c) {
			t.Errorf("full plugin does not report %s: %v", c, d.Capabilities)
		}
	}
}

func TestConfigureBrokersHostServices(t *testing.T) {
	p := &lifecycleOnly{}
	host := &capabilitytest.Host{
		ListPluginsFunc: func(_ context.Context, c capability.Capability) ([]capability.PluginInfo, error) {
			return []capability.PluginInfo{{Name: "a", State: "running", Capabilities: []capability.Capability{c}}}, nil
		},
		CollectMetricsFunc: func(_ context.Context, plugin string) (capability.MetricsPayload, error) {
			if plugin == "down" {
				return capability.MetricsPayload{}, capability.ErrUnavailable
			}
			return capability.MetricsPayload{Body: []byte("m_" + plugin), Format: "text"}, nil
		},
		ListTasksFunc: func(_ context.Context, plugin string) ([]capability.TaskSpec, error) {
			return []capability.TaskSpec{{Name: plugin + ".hello", Topic: "default", MaxAttempts: 3, Timeout: 90 * time.Second}}, nil
		},
	}
	capabilitytest.Start(t, p, map[string]any{"workers": 3}, host)
	if string(p.config) != `{"workers":3}` {
		t.Fatalf("config = %s", p.config)
	}
	ctx := context.Background()
	list, err := p.host.ListPlugins(ctx, capability.Metrics)
	if err != nil || len(list) != 1 || list[0].Name != "a" || list[0].Capabilities[0] != capability.Metrics {
		t.Fatalf("list plugins = %+v, %v", list, err)
	}
	m, err := p.host.CollectMetrics(ctx, "x")
	if err != nil || string(m.Body) != "m_x" {
		t.Fatalf("collect = %+v, %v", m, err)
	}
	if _, err := p.host.CollectMetrics(ctx, "down"); !errors.Is(err, capability.ErrUnavailable) {
		t.Fatalf("collect from a down plugin: %v, want ErrUnavailable", err)
	}
	specs, err := p.host.ListTasks(ctx, "ex")
	if err != nil || len(specs) != 1 || specs[0].Name != "ex.hello" || specs[0].MaxAttempts != 3 || specs[0].Timeout != 90*time.Second {
		t.Fatalf("list tasks through the host = %+v, %v", specs, err)
	}
	if _, err := p.host.RunTask(ctx, "nobody", capability.TaskRun{Task: "x"}, nil); !errors.Is(err, capability.ErrNotFound) {
		t.Fatalf("run task with no provider: %v, want ErrNotFound", err)
	}
}

func TestInvalidConfigCrossesTheWire(t *testing.T) {
	c := capabilitytest.Connect(t, &lifecycleOnly{badCfg: true})
	err := c.Configure(context.Background(), capability.ConfigureRequest{Config: json.RawMessage(`{}`), Host: &capabilitytest.Host{}})
	var bad *capability.InvalidConfigError
	if !errors.As(err, &bad) || !strings.Contains(bad.Error(), "workers: must be positive") {
		t.Fatalf("configure error = %v, want InvalidConfigError naming workers", err)
	}
}

func TestHealthAndStop(t *testing.T) {
	p := &lifecycleOnly{}
	c := capabilitytest.Connect(t, p)
	h, err := c.CheckHealth(context.Background())
	if err != nil || h.Status != capability.HealthDegraded || h.Message != "half" {
		t.Fatalf("health = %+v, %v", h, err)
	}
	if err := c.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if p.stopped != 1 {
		t.Fatalf("stopped = %d", p.stopped)
	}
}

func proxy(t *testing.T, c *capability.Client, req capability.ProxyRequest) (int, http.Header, string, int) {
	t.Helper()
	var status int
	var hdr http.Header
	var body strings.Builder
	chunks := 0
	err := c.ProxyHTTP(context.Background(), req, func(s int, h http.Header) { status, hdr = s, h }, func(b []byte) error {
		chunks++
		body.Write(b)
		return nil
	})
	if err != nil {
		t.Fatalf("proxy %s: %v", req.Path, err)
	}
	return status, hdr, body.String(), chunks
}

func TestHTTPRoundTrip(t *testing.T) {
	c := capabilitytest.Connect(t, &full{})
	status, hdr, body, _ := proxy(t, c, capability.ProxyRequest{
		Method: "POST", Path: "/echo", RawQuery: "a=1&b=2", Body: []byte("hello"), Actor: "tester",
		Header: http.Header{"Content-Type": {"text/plain"}},
	})
	if status != http.StatusTeapot || body != "POST hello" || hdr.Get("X-Seen-Query") != "a=1&b=2" || hdr.Get("X-Seen-Actor") != "tester" {
		t.Fatalf("echo: %d %q %v", status, body, hdr)
	}
	status, _, body, chunks := proxy(t, c, capability.ProxyRequest{Method: "GET", Path: "/big"})
	if status != 200 || len(body) != 100000 || chunks < 3 {
		t.Fatalf("big: status %d, %d bytes in %d chunks", status, len(body), chunks)
	}
	_, _, body, chunks = proxy(t, c, capability.ProxyRequest{Method: "GET", Path: "/stream"})
	if body != "event 0\nevent 1\nevent 2\n" || chunks != 3 {
		t.Fatalf("stream: %q in %d chunks, want 3 flushed chunks", body, chunks)
	}
	status, _, body, _ = proxy(t, c, capability.ProxyRequest{Method: "GET", Path: "/empty"})
	if status != http.StatusNoContent || body != "" {
		t.Fatalf("empty: %d %q", status, body)
	}
	status, _, _, _ = proxy(t, c, capability.ProxyRequest{Method: "GET", Path: "/nope"})
	if status != http.StatusNotFound {
		t.Fatalf("unknown path: %d", status)
	}
}

func TestActionsAndErrors(t *testing.T) {
	c := capabilitytest.Connect(t, &full{})
	ctx := context.Background()
	specs, err := c.ListActions(ctx)
	if err != nil || len(specs) != 1 || specs[0].ID != "go" || !specs[0].Confirm || specs[0].TimeoutSeconds != 5 {
		t.Fatalf("list actions = %+v, %v", specs, err)
	}
	res, err := c.InvokeAction(ctx, capability.ActionRequest{ActionID: "go", Actor: "ops"})
	if err != nil || res.Message != "went as ops" || string(res.Result) != `{"n":1}` {
		t.Fatalf("invoke = %+v, %v", res, err)
	}
	_, err = c.InvokeAction(ctx, capability.ActionRequest{ActionID: "bad"})
	var bad *capability.InvalidArgumentError
	if !errors.As(err, &bad) || bad.Msg != "bad params" {
		t.Fatalf("invoke bad = %v, want InvalidArgumentError", err)
	}
	if _, err = c.InvokeAction(ctx, capability.ActionRequest{ActionID: "nope"}); !errors.Is(err, capability.ErrNotFound) {
		t.Fatalf("invoke unknown = %v, want ErrNotFound", err)
	}
}

func TestTasksStreamEvents(t *testing.T) {
	c := capabilitytest.Connect(t, &full{})
	ctx := context.Background()
	specs, err := c.ListTasks(ctx)
	if err != nil || len(specs) != 1 || specs[0].Name != "t.add" || specs[0].MaxAttempts != 2 {
		t.Fatalf("list tasks = %+v, %v", specs, err)
	}
	rec := &recorder{}
	res, err := c.RunTask(ctx, capability.TaskRun{Task: "t.add", Payload: json.RawMessage(`{"a":1}`)}, rec)
	if err != nil || string(res) != `{"a":1}` {
		t.Fatalf("run = %s, %v", res, err)
	}
	if len(rec.logs) != 1 || rec.logs[0] != "starting t.add" || len(rec.progress) != 1 || rec.progress[0] != 0.5 {
		t.Fatalf("events: logs %v progress %v", rec.logs, rec.progress)
	}
	_, err = c.RunTask(ctx, capability.TaskRun{Task: "t.fail"}, nil)
	var te *capability.TaskError
	if !errors.As(err, &te) || te.Msg != "boom" {
		t.Fatalf("failing task = %v, want TaskError boom", err)
	}
}

func TestValidName(t *testing.T) {
	for name, want := range map[string]bool{
		"tasks_worker": true, "metrics": true, "a1": true,
		"": false, "Tasks": false, "tasks-worker": false, "1abc": false, "_x": false,
		strings.Repeat("a", 41): true, strings.Repeat("a", 42): false,
	} {
		if got := capability.ValidName(name); got != want {
			t.Errorf("ValidName(%q) = %v, want %v", name, got, want)
		}
	}
}
