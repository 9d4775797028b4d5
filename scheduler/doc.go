// Package scheduler runs the beat: the one process, among all that share a
// broker, that drives time-based work. Leader elects it with a lease that
// has a term (a fencing token): the holder renews it well within its TTL,
// a standby takes it over within the TTL once the holder dies or stops, and
// every leader-only write names the term so that a deposed leader that has
// not noticed yet cannot act. A leader whose renewals do not land stops its
// work half a renewal before the lease could run out (by its monotonic
// clock, from before the last renewal that held), so a standby never leads
// while it still works.
//
// The beat runs the orphan reaper in-process every interval (never as a
// queued task: the failure it repairs is a topic that cannot dispatch).
package scheduler
