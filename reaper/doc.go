// Package reaper reclaims the messages and locks a dead worker left behind.
//
// A worker that dies mid-task never acks: its message stays running, and
// since a topic's concurrency limit is the count of its running rows, every
// such orphan burns a slot until the topic wedges. Pass finds running
// messages whose claimer has no fresh heartbeat and requeues them (or
// dead-letters them past MaxAttempts), and releases the locks such workers
// held, all under one live-worker set.
//
// It fails closed. It changes nothing, logs at ERROR and counts a skip when
// the live set cannot be read, when it is empty, when the caller itself is
// not in it (heartbeats are not being written, or clocks disagree), and it
// leaves alone claims younger than the grace window (a worker that just
// claimed may not have written its first heartbeat yet). A reaper that
// fails closed on every pass protects nothing, so the skip counter exists to
// make that visible.
//
// ReclaimDead is the certain path beside it: the work of workers whose
// process is known to have ended (its parent saw it exit) comes back at
// once, its youngest claims too. The guards above protect a judgement
// made from heartbeats; ReclaimDead makes none, so none applies to it, and
// it is never used for a worker that is only silent.
//
// Requeuing runs a task again: delivery is at least once. Tasks with side
// effects that must not repeat have to be idempotent; MaxAttempts bounds a
// poison task that kills every worker that takes it.
package reaper
