// Package client is a Go client of a running taskhost: it submits tasks
// to the tasks_worker plugin's API (one at a time, or streamed in batches
// of millions), reads them back, waits for them, lists them, cancels
// them, and manages schedules, topics, reports and the host's plugins.
//
//	c := client.New("http://127.0.0.1:8080", client.WithToken(os.Getenv("TASKHOST_ADMIN_TOKEN")))
//	id, err := c.Submit(ctx, client.Task{Task: "demo.echo", Payload: json.RawMessage(`{"hello":"world"}`)})
//	t, err := c.Wait(ctx, id) // t.State is done, failed, dead or cancelled
//
// # Errors
//
// An answer of 400 or more is an *APIError carrying the host's message
// (IsNotFound, IsBadRequest, IsConflict, IsUnauthorized, IsUnavailable
// test for the usual ones). A call that may have changed something
// without the client hearing how it ended wraps ErrOutcomeUnknown: the
// host says so with "X-Taskhost-Outcome: unknown" (its plugin stopped or
// timed out while handling the request), and the client says so when
// the connection broke or the context ended after the request left. Such
// a call may have been done; look before sending it again.
//
// # Retries
//
// Reads (Get, Wait, List, Schedules, GetSchedule, Reports, GetReport,
// Topics, Plugins) are retried per the RetryPolicy (DefaultRetry unless
// WithRetry says otherwise) on a 502, 503 or 504 and on any connection
// failure. Submit, Cancel, CancelQueued, CreateSchedule, UpdateSchedule,
// DeleteSchedule and SetTopic are retried only on a 503 (the host or the plugin could not
// take the request now; a Retry-After is honoured) and when no connection
// could be made (the request never left). A call that ends with
// ErrOutcomeUnknown is never retried, nor is any other answer.
//
// Duplicates: a task without a unique key submitted twice is stored
// twice, but never by Submit's automatic retries: tasks_worker answers a
// submit 503 only when it stored nothing, and one whose database's answer
// was lost (it may be stored) with "X-Taskhost-Outcome: unknown", which is
// ErrOutcomeUnknown. A task with a UniqueKey may be sent again after
// ErrOutcomeUnknown: the retry finds the first one and answers its id as a
// duplicate (SubmitUnique says so). SubmitBatch, SubmitTasks and SubmitNDJSON are
// never retried (a stream cannot be sent again), and Action (Reclaim) is
// never retried. Retrying any of them by hand after ErrOutcomeUnknown, or
// after a *BatchError without starting from its Line, may store tasks
// without a unique key twice.
package client
