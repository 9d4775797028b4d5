package capability

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"regexp"
	"time"
)

// ProtocolVersion is the wire version of this contract. It changes only on
// a breaking change of the protobuf services.
const ProtocolVersion = 1

// A Capability names one optional service a plugin may serve.
type Capability string

// The capabilities a plugin can report in Describe.
const (
	Lifecycles Capability = "lifecycle"
	Metrics    Capability = "metrics"
	HTTP       Capability = "http"
	Actions    Capability = "actions"
	Tasks      Capability = "tasks"
	// HTTPBodyStream says the plugin's HTTP handler takes a request body
	// as a stream (the ServeHTTPStream call), not only whole. Every plugin
	// built with this package since the call exists serves it with its
	// HTTPHandler; the host sends streamed bodies only to plugins that
	// list it, so an older plugin binary keeps getting whole bodies.
	HTTPBodyStream Capability = "http_body_stream"
	// TasksStream says the plugin's TaskProvider runs attempts on one
	// long-lived stream (the RunTasks call), many at a time, besides one
	// call per attempt (RunTask). Every TaskProvider built with this
	// package since the call exists serves it; tasks_worker uses it only
	// with providers that list it, so an older plugin binary keeps getting
	// one call per attempt.
	TasksStream Capability = "tasks_stream"
	// TasksDirect says the plugin's TaskProvider serves its stream of
	// attempts on a listener of its own too (the frames of
	// docs/plugin-protocol.md), opened for the task system when the host
	// asks (OpenTaskListener), so that attempts go without the host
	// relaying each frame. Every TaskProvider built with this package
	// since the call exists serves it; the stream of a provider that does
	// not list it is relayed by the host.
	TasksDirect Capability = "tasks_direct"
	// TaskSubmit says the plugin runs the task system and takes the other
	// plugins' submits (TaskSubmitter), which the host hands it through
	// HostServices.SubmitTasks.
	TaskSubmit Capability = "task_submit"
)

// AllCapabilities lists every capability in a stable order.
var AllCapabilities = []Capability{Lifecycles, Metrics, HTTP, HTTPBodyStream, Actions, Tasks, TasksStream, TasksDirect, TaskSubmit}

// namePattern is the rule for plugin names: the same string is the config
// key, the URL segment and the metric prefix.
var namePattern = regexp.MustCompile(`^[a-z][a-z0-9_]{0,40}$`)

// ValidName reports whether name is an acceptable plugin name.
func ValidName(name string) bool { return namePattern.MatchString(name) }

// Description is what a plugin says about itself.
type Description struct {
	Name         string
	Version      string
	APIVersions  []int
	Capabilities []Capability
	// PID is the plugin process id, filled in by Serve.
	PID int
}

// Has reports whether d lists c.
func (d Description) Has(c Capability) bool {
	for _, x := range d.Capabilities {
		if x == c {
			return true
		}
	}
	return false
}

// ConfigureRequest is handed to a plugin every time it starts.
type ConfigureRequest struct {
	// Config is the plugin's free-form `config` block from the host's
	// config file, as JSON ("{}" when absent).
	Config json.RawMessage
	// Host is the host's services, bound to this plugin. It stays valid
	// until the plugin process exits.
	Host HostServices
	// HostVersion is the version of the host binary.
	HostVersion string
	// LogLevel is the host's log level ("info", "debug", ...).
	LogLevel string
}

// HealthStatus is the outcome of a health check.
type HealthStatus int

// Health statuses.
const (
	HealthUnknown HealthStatus = iota
	HealthOK
	HealthDegraded
	HealthError
)

func (s HealthStatus) String() string {
	switch s {
	case HealthOK:
		return "ok"
	case HealthDegraded:
		return "degraded"
	case HealthError:
		return "error"
	}
	return "unknown"
}

// Health is a plugin's answer to CheckHealth.
type Health struct {
	Status  HealthStatus
	Message string
}

// Lifecycle is served by every plugin.
type Lifecycle interface {
	// Describe returns the plugin's name, version and capabilities. The
	// host refuses a plugin whose name differs from its config key.
	Describe(ctx context.Context) (Description, error)
	// Configure is called once per process start, before anything else
	// but Describe. A plugin returns an *InvalidConfigError for a config
	// it cannot use; the host then shows the message and does not retry
	// in a loop.
	Configure(ctx context.Context, req ConfigureRequest) error
	// CheckHealth is polled by the host.
	CheckHealth(ctx context.Context) (Health, error)
	// Stop drains the plugin gracefully before the host kills it. The
	// context carries the drain deadline.
	Stop(ctx context.Context) error
}

// ConfigChecker is optional: a plugin that can check its config block
// without starting anything implements it, and `host check-config` then
// checks that block too. The host runs the plugin binary as
// `<binary> check-config` with the block (JSON) on stdin; Serve answers
// (CheckConfigExit). Return an *InvalidConfigError naming the key.
type ConfigChecker interface {
	CheckConfig(raw json.RawMessage) error
}

// CheckConfigArg is the argument with which a plugin binary checks the
// config block on its stdin and exits (see ConfigChecker).
const CheckConfigArg = "check-config"

// Exit statuses of `<binary> check-config`. On CheckConfigInvalid the
// standard output holds the error as JSON: {"key": "...", "problem": "..."}.
// (A binary that does not know the argument exits 1, go-plugin's status
// for a plugin run by hand.)
const (
	CheckConfigOK          = 0
	CheckConfigUnsupported = 3
	CheckConfigInvalid     = 4
)

// MetricsPayload is a Prometheus exposition and its expfmt content type.
type MetricsPayload struct {
	Body   []byte
	Format string
}

// MetricsProvider is implemented by plugins that expose metrics.
type MetricsProvider interface {
	CollectMetrics(ctx context.Context) (MetricsPayload, error)
}

// HTTPHandler is implemented by plugins that serve HTTP under
// /plugin-pkg/<name>/. The request path seen by the plugin starts at "/".
// It is http.Handler: a chi router or http.ServeMux satisfies it.
//
// A request with Content-Type application/x-ndjson may come with its body
// streamed (ContentLength -1): r.Body yields the body as the client sends
// it, and the handler may write (and Flush) its answer while it still
// reads. A streamed body cut short (the client went away, or stopped
// sending for body_timeout_seconds) reads as an error wrapping
// io.ErrUnexpectedEOF, never as a clean end.
type HTTPHandler interface {
	http.Handler
}

// ActionSpec describes one operator action rendered by the admin UI.
type ActionSpec struct {
	ID          string `json:"id"`
	Title       string `json:"title"`
	Description string `json:"description"`
	// Confirm asks the UI to confirm before invoking.
	Confirm bool `json:"confirm"`
	// Dangerous actions are shown as such.
	Dangerous bool `json:"dangerous"`
	// TimeoutSeconds bounds the call; 0 means the host's default.
	TimeoutSeconds int `json:"timeout_seconds"`
}

// ActionRequest is one invocation of an action.
type ActionRequest struct {
	ActionID  string
	Params    json.RawMessage
	Actor     string
	RequestID string
}

// ActionResult is what an action answers. Message is for a person; Result
// is machine-readable JSON (may be empty).
type ActionResult struct {
	Message string
	Result  json.RawMessage
}

// ActionProvider is implemented by plugins with operator actions.
type ActionProvider interface {
	ListActions(ctx context.Context) ([]ActionSpec, error)
	InvokeAction(ctx context.Context, req ActionRequest) (ActionResult, error)
}

// TaskSpec describes a task another plugin can run.
type TaskSpec struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	Topic       string `json:"topic"`
	// MaxAttempts bounds the attempts of one task (1: no retry); 0 means
	// the default, 3.
	MaxAttempts int `json:"max_attempts"`
	// Timeout bounds one attempt: when it runs out the attempt's context
	// is cancelled and it fails as timed out (and is retried while
	// attempts remain). 0: no bound.
	Timeout time.Duration `json:"timeout,omitempty"`
}

// TaskRun is one execution of a provided task.
type TaskRun struct {
	Task      string
	Payload   json.RawMessage
	MessageID string
	Attempt   int
	// Headers are the task's headers as submitted (trace context such as
	// traceparent, the schedule that fired it); nil on the per-attempt
	// call (RunTask), which does not carry them.
	Headers map[string]string
}

// TaskEvents receives what a running task reports.
type TaskEvents interface {
	Log(line string)
	Progress(fraction float64)
}

// TaskProvider is implemented by plugins that offer tasks to tasks_worker.
//
// RunTask runs one attempt. Its context is cancelled when the attempt must
// stop (its timeout passed, the task was cancelled, the worker stops):
// return soon after. Until RunTask returns the attempt keeps its place in
// its topic's concurrency limit, however long that takes, so that a limit
// always bounds the code that really runs.
type TaskProvider interface {
	ListTasks(ctx context.Context) ([]TaskSpec, error)
	RunTask(ctx context.Context, run TaskRun, events TaskEvents) (json.RawMessage, error)
}

// TaskCapacity is optional for a TaskProvider: the most attempts it runs
// at once (DefaultTaskCapacity without it). tasks_worker never sends it
// more; past it, the workers that would run its tasks wait, and so do
// their claims.
type TaskCapacity interface {
	TaskCapacity() int
}

// DefaultTaskCapacity is the capacity of a TaskProvider that does not say.
const DefaultTaskCapacity = 256

// TaskSubmission is one task to queue: the fields of POST tasks.
type TaskSubmission struct {
	Task  string `json:"task"`
	Topic string `json:"topic,omitempty"`
	// Payload is JSON; empty is {}.
	Payload json.RawMessage `json:"payload,omitempty"`
	// Delay postpones the first attempt (exclusive with RunAt).
	Delay time.Duration `json:"-"`
	// RunAt, when not zero, is when the first attempt may start.
	RunAt       time.Time `json:"-"`
	MaxAttempts int       `json:"max_attempts,omitempty"`
	Priority    int       `json:"priority,omitempty"`
	// UniqueKey, when not empty, makes a second submit of the same key
	// answer the first task instead of queueing another (see POST tasks).
	UniqueKey    string        `json:"unique_key,omitempty"`
	UniqueFor    time.Duration `json:"-"`
	UniqueStates []string      `json:"unique_states,omitempty"`
	// ParentTaskID is the task whose attempt submits this one; Submit sets
	// it from its context inside a task.
	ParentTaskID string `json:"parent_task_id,omitempty"`
}

// SubmittedTask is what a submit stored: the task's id, or, for a
// duplicate unique key, the id of the task that holds it.
type SubmittedTask struct {
	ID        string `json:"id"`
	Duplicate bool   `json:"duplicate,omitempty"`
}

// TaskSubmitter is implemented by the plugin that runs the task system
// (tasks_worker): it queues the tasks other plugins submit through
// HostServices.SubmitTasks, all or none. plugin names the plugin that
// submits, as the host knows it.
type TaskSubmitter interface {
	SubmitTasks(ctx context.Context, plugin string, tasks []TaskSubmission) ([]SubmittedTask, error)
}

// PluginInfo is the host's view of one plugin.
type PluginInfo struct {
	Name         string
	Version      string
	State        string
	Capabilities []Capability
}

// HostServices is what the host offers each plugin.
type HostServices interface {
	// ListPlugins lists every enabled plugin with its state (running or not)
	// and its capabilities; with a capability, only those that serve it
	// (plus plugins whose capabilities are not known yet). Listing all, or
	// the metrics capability, also lists the host itself, named "host" (a
	// name no plugin may take), whose own series CollectMetrics gives too.
	ListPlugins(ctx context.Context, c Capability) ([]PluginInfo, error)
	// CollectMetrics asks the named plugin for its metrics.
	CollectMetrics(ctx context.Context, plugin string) (MetricsPayload, error)
	// RunTask runs a task provided by the named plugin.
	RunTask(ctx context.Context, plugin string, run TaskRun, events TaskEvents) (json.RawMessage, error)
	// ListTasks lists the tasks the named plugin provides.
	ListTasks(ctx context.Context, plugin string) ([]TaskSpec, error)
	// SubmitTasks queues tasks in the task system, on behalf of the
	// calling plugin: all of them, or none and an error. It fails with
	// ErrUnavailable while no plugin that takes submits runs, and with an
	// *InvalidArgumentError for a task the task system refuses.
	SubmitTasks(ctx context.Context, tasks []TaskSubmission) ([]SubmittedTask, error)
}

// Errors a caller can test with errors.Is.
var (
	// ErrUnavailable means the plugin is not running (starting, restarting,
	// failed or stopped).
	ErrUnavailable = errors.New("plugin unavailable")
	// ErrNotFound means there is no such plugin, action or task.
	ErrNotFound = errors.New("not found")
	// ErrUnimplemented means the plugin does not serve that capability.
	ErrUnimplemented = errors.New("capability not implemented by plugin")
)

// InvalidConfigError is returned by Configure for a configuration the
// plugin cannot use. Key names the offending setting.
type InvalidConfigError struct {
	Key     string
	Problem string
}

func (e *InvalidConfigError) Error() string {
	if e.Key == "" {
		return "invalid config: " + e.Problem
	}
	return "invalid config: " + e.Key + ": " + e.Problem
}

// InvalidArgumentError is returned by an action or a task for bad input.
type InvalidArgumentError struct{ Msg string }

func (e *InvalidArgumentError) Error() string { return e.Msg }

// CapabilitiesOf lists the capabilities v implements, Lifecycle first.
func CapabilitiesOf(v any) []Capability {
	var out []Capability
	if _, ok := v.(Lifecycle); ok {
		out = append(out, Lifecycles)
	}
	if _, ok := v.(MetricsProvider); ok {
		out = append(out, Metrics)
	}
	if _, ok := v.(HTTPHandler); ok {
		out = append(out, HTTP, HTTPBodyStream)
	}
	if _, ok := v.(ActionProvider); ok {
		out = append(out, Actions)
	}
	if _, ok := v.(TaskProvider); ok {
		out = append(out, Tasks, TasksStream, TasksDirect)
	}
	if _, ok := v.(TaskSubmitter); ok {
		out = append(out, TaskSubmit)
	}
	return out
}
