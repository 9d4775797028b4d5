// Package tasksworker is the tasks_worker plugin: the task system of
// taskhost. It wires a broker (chosen by the config's broker setting: the
// embedded SQLite "local" broker by default, "postgres" for several hosts
// sharing one database, or "memory", whose queue dies with the process),
// the worker runtime (package worker), the orphan reaper and the beat
// (packages reaper and scheduler) and the built-in tasks together, and
// serves them through the plugin capabilities: an HTTP API to submit and
// inspect tasks, topics, schedules, reports, workers and locks; an
// operator's web UI; Prometheus metrics from its own registry (broker
// gauges read at scrape time, process-local task counters); and operator
// actions.
//
// # Layout
//
// Every operation on the task system (submitting and placing a task,
// schedules, topics, locks, requeue, cancel, purge, drain, the reclaim
// pass) is one plain Go call of package service
// (plugins/tasksworker/service), made by everything that does it:
//
//   - api*.go: the JSON API under /api. A handler decodes the request,
//     calls the service and encodes its answer; api.go maps the
//     service's and the broker's errors to HTTP statuses, once.
//   - package ui (plugins/tasksworker/ui): the web UI under /ui, with its
//     templates embedded. It depends on the service alone and maps its
//     errors to the pages' messages, once.
//   - plugin.go: the Plugin and its capabilities; runtime.go: what
//     Configure starts (broker, worker pool, reaper, beat, and the service
//     over them), where the config's schedules and the beat's schedule
//     lookup go through the service; actions.go: the reclaim action,
//     through the service.
//   - config.go parses the config (config_values.go, one value; brokers.go
//     opens the broker it names); topics.go applies its topics;
//     providers.go registers the tasks of other plugins; tasks.go holds
//     the built-in tasks; fastpath.go reclaims the work of a crashed
//     neighbour on this machine early; metrics.go is the Prometheus
//     registry; dupkeys.go finds duplicate keys in request bodies.
//
// The limits on what a client may ask for (delay, attempts, payload size,
// name lengths, list sizes) are one table in package broker
// (broker/limits.go): the API, the UI and every broker check the same.
//
// The metric names are a public interface: alert rules select them by name,
// and a renamed series silently matches nothing. The golden test in
// metrics_test.go fails when one is renamed or dropped.
package tasksworker
