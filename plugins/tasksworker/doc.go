// Package tasksworker is the tasks_worker plugin: the task system of
// taskhost. It wires a broker (chosen by the config's broker setting), the
// worker runtime (package worker) and the built-in tasks together, and
// serves them through the plugin capabilities: an HTTP API to submit and
// inspect tasks, topics, workers and locks; Prometheus metrics from its own
// registry (broker gauges read at scrape time, process-local task
// counters); and operator actions.
//
// Only the memory broker is available in this build: "local" and "postgres"
// are valid names that Configure refuses with a message, and the orphan
// reaper answers that the memory broker cannot orphan anything (its queue
// dies with the process).
//
// The metric names are a public interface: alert rules select them by name,
// and a renamed series silently matches nothing. The golden test in
// metrics_test.go fails when one is renamed or dropped.
package tasksworker
