// Package pgtx queues taskhost tasks inside an application's own
// PostgreSQL transaction, for applications that share the database of the
// postgres broker: the task exists if and only if the transaction
// commits, so an order row and the task that mails its receipt are
// written together or not at all.
//
//	tx, err := pool.Begin(ctx)
//	...
//	_, err = tx.Exec(ctx, `INSERT INTO orders ...`)
//	...
//	id, err := pgtx.Submit(ctx, tx, pgtx.Task{Topic: "mail", Name: "mail.receipt", Payload: payload})
//	...
//	err = tx.Commit(ctx)
//
// The task is written by the broker's own insert statement
// (broker/postgres.Inserter), with the checks the HTTP API applies
// (broker.ValidateSubmit): a request they refuse returns an error wrapping
// broker.ErrInvalid before anything is sent, and the transaction is
// untouched. An error after that (the database refused the insert) leaves
// the transaction aborted, as any failed statement does: roll it back.
// A second statement announces the task (NOTIFY on the broker's channel,
// see broker/postgres.NotifyChannel), which PostgreSQL delivers at commit,
// so idle worker pools on every host claim it at once.
//
// The announcement has a cost: PostgreSQL commits notifying transactions
// one at a time, each holding a database-wide lock from the start of its
// commit to the end of its WAL flush. Transactions that call Submit
// therefore commit one after the other, at most one a WAL flush however
// many clients commit, where plain inserts would commit side by side. An
// application that enqueues
// at a high rate can pass WithoutNotify: its tasks are then found by the
// pools' fallback poll (5 s by default) instead. The broker's own Submit
// announces after its commit, from a transaction of its own, and does not
// pay this.
//
// # Schema and versions
//
// The tables are in the broker's schema: WithSchema names it (the
// broker's schema setting; default public). Writing them from outside the
// broker makes their layout a public contract: this package writes the
// tw_topics and tw_messages tables as they are from migration 1 through
// MaxVersion (17 in this release). Before its first write to a schema,
// and again at most once a minute after (RecheckAfter; the answer is
// cached per database address, database and schema in this process), it
// reads the schema's migration version in the transaction and refuses a
// version it does not know with a *VersionError: tables migrated by a
// newer taskhost ("upgrade the package"), or no tables at all ("run
// `host migrate`"). A refused version is never cached: it is read again
// on the next call.
//
// # What is not checked
//
// The application has no list of the tasks the live workers run, so,
// unlike the HTTP API, Submit cannot check that a worker runs Name, and
// cannot fill in a task's own topic: Topic is required. A task nobody
// serves the topic of stays queued. A task whose topic is served but
// whose name no live worker runs waits for one (requeued every few
// seconds, for tasks_worker's unknown-task wait, 10 minutes, in case the
// host that runs it is restarting), then fails with the error "unknown
// task "<name>": no task of that name is registered in worker <id>",
// visible in the task's last_error in the API and UI.
package pgtx
