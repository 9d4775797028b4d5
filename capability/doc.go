// Package capability is the contract between the taskhost host and its
// plugins.
//
// A plugin is a separate binary named fp-plugin-<name>. Its main calls
// Serve with a value that implements Lifecycle and, optionally, any of
// MetricsProvider, HTTPHandler, ActionProvider and TaskProvider. Serve finds
// the optional capabilities by type assertion and registers only the gRPC
// services the value really implements; Describe reports the same list.
// An HTTPHandler also reports HTTPBodyStream: it serves the streamed-body
// call too, through which the host sends an NDJSON upload as it arrives.
//
// A TaskProvider's RunTask ends an attempt with a result, an error (a
// failure, retried by the task's rules), or one of the outcomes Snooze,
// Permanent and CancelTask, which travel to tasks_worker in the final
// RunTaskEvent; a caller reads them from the TaskError it gets. RunTask's
// context is cancelled when the task is cancelled while it runs.
//
// The host talks to a plugin through a Client, and serves HostServices back
// to it over go-plugin's GRPCBroker: a plugin never talks to another plugin
// directly. The generated protobuf code lives in capability/internal and is
// not part of the public surface.
//
// Plugins must never write to stdout: it carries the go-plugin handshake.
// Serve sets up a JSON hclog logger on stderr (see Logger) and redirects the
// standard library's log package into it.
package capability
