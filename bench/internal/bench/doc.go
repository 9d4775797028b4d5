// Package bench is `host bench`, which the host runs as the bench's own
// binary beside it (bin/taskhost-bench, cmd/taskhost-bench). It measures the broker and the worker
// pool as they ship: the real worker.Pool with its default options (only
// Concurrency is set) running a no-op task from a worker.Registry, against
// a broker opened with its default options. Each run has three phases,
// and -runs repeats them; every run is printed and so is the median:
//
//   - bulk submit: -jobs messages queued, through SubmitMany
//     (batches of -submit-batch; Submit when it is 1), from
//     -submitters goroutines;
//   - burn-down: from just before Pool.Start until the observer has seen
//     all -jobs of them done (the pool reports an attempt after its outcome
//     is written: for a done message, after the Ack committed) and the
//     pool has stopped with every task report stored, one topic with
//     concurrency limit -limit, -workers handlers. The pool stores a report
//     per attempt as the tasks_worker plugin does (a worker.ReportWriter
//     into the pool's own broker); -pool-only leaves the reports out and
//     stops the clock at the last done message. On postgres it also
//     prints the WAL written per message (pg_stat_wal, wal.go) and checks
//     that every done message has its success report;
//   - steady stream: after a checkpoint (postgres, untimed: the
//     burn-down's dirty pages are not flushed inside the window),
//     -rate submits a second for -duration on a fresh
//     topic, one Submit per message from an open-loop schedule (each call
//     starts at its planned time in a goroutine of its own, at most 64 in
//     flight), followed by Pool.Wake as the tasks_worker plugin's submit
//     API does. End-to-end latency runs from just before Submit is called
//     to the moment the pool reports the message done, which is after the
//     Ack that marks it done returned (committed).
//
// With -claim-latency (postgres only) it then seeds 1,000 and 1,000,000
// queued messages in turn and times Claim of one message, nacking each
// claimed message back outside the timer so the depth stays put.
//
// -real-host (postgres) replaces the three phases with the whole path a
// user runs (realhost.go): the host and tasks_worker plugin binaries as
// processes, tasks submitted through the HTTP batch endpoint, and
// completions counted in the database.
//
// -across-hosts and -idle-pools (postgres) replace the three phases with
// measurements of several hosts sharing the database (hosts.go): the
// steady stream submitted by one broker and run by another broker's pool,
// and the transactions per second idle pools cost, each with the pools
// waiting for announcements and polling as before.
package bench
