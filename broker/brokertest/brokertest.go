// Package brokertest is the conformance suite every broker implementation
// passes (memory, local, postgres): the shared semantics of broker.Broker
// stated as tests.
//
// The rules it checks are written once, in package broker's
// documentation. Run holds every broker to them; RunDurable adds the cases
// of the stores whose running messages outlive their workers (orphan
// reclaim, fenced passes, leader election across brokers on one store).
//
// Worker liveness thresholds are implementation settings and are not
// tested here (they would need the suite to wait for a heartbeat to go
// stale).
package brokertest

import (
	"errors"
	"testing"

	"github.com/taskhost/taskhost/broker"
)

// Run runs the suite. newBroker returns a fresh, empty broker for one
// subtest and should register its cleanup (Close, dropping the database)
// with t.Cleanup; it is called from parallel subtests. A broker the suite
// closed itself may be closed again by that cleanup.
//
// Options, at most one, name the cases that cannot apply to the broker.
func Run(t *testing.T, newBroker func(t *testing.T) broker.Broker, opts ...Options) {
	o := optionsOf(t, opts)
	defer o.checkNames(t)
	runCases(t, newBroker, o, []testCase[broker.Broker]{
		{"SubmitThenClaim", testSubmitThenClaim},
		{"SubmitDefaults", testSubmitDefaults},
		{"InvalidSubmitStoresNothing", testInvalidSubmit},
		{"SubmitMany", testSubmitMany},
		{"CancelledContext", testCancelledContext},
		{"DelayedMessageWaits", testDelayed},
		{"FIFOWithinTopic", testFIFO},
		{"FairAcrossTopics", testFairness},
		{"ClaimEdgeCases", testClaimEdgeCases},
		{"ConcurrencyLimitUnderContention", testConcurrencyLimit},
		{"StaleTokenChangesNothing", testStaleToken},
		{"UnstorableOutcomes", testUnstorableOutcomes},
		{"NackRequeueRedelivers", testNackRequeue},
		{"NackNotRunGivesTheAttemptBack", testNackNotRun},
		{"NackWithoutRequeue", testNackNoRequeue},
		{"NackKeepsStateInFields", testNackKeepsStateInFields},
		{"DrainAndResume", testDrain},
		{"Purge", testPurge},
		{"DeadLetterAndRequeue", testDeadLetterRequeue},
		{"LocksUnderContention", testLocks},
		{"LocksReleasedWhenClaimEnds", testLocksAutoRelease},
		{"WorkersAndStats", testWorkersStats},
		{"StatsCountEveryWrite", testStatsCountEveryWrite},
		{"RunningClaims", testRunningClaims},
		{"Topics", testTopics},
		{"ListMessages", testListMessages},
		{"Leases", testLeases},
		{"Closed", testClosed},
		{"UniqueConcurrentSubmits", testUniqueConcurrent},
		{"UniqueStates", testUniqueStates},
		{"UniqueWindow", testUniqueWindow},
		{"UniqueBatch", testUniqueBatch},
		{"PriorityOrder", testPriorityOrder},
		{"RunAt", testRunAt},
		{"InvalidIntake", testInvalidIntake},
		{"UniqueScheduleFire", testUniqueScheduleFire},
	})
	runCases(t, newBroker, o, cancelCases)
	runCases(t, newBroker, o, outcomeReportCases)
}

// testCase is one case of a suite, run on a fresh S.
type testCase[S any] struct {
	name string
	fn   func(t *testing.T, s S)
}

// Options adjust a run of a suite to a broker.
type Options struct {
	// NotApplicable names the cases that cannot apply to the broker, each
	// with the reason. Such a case still runs as a subtest of its name: it
	// logs that it does not apply and why, and passes; it is never
	// skipped silently. A name that is no case of the suite fails the run.
	NotApplicable map[string]string
}

// suiteOptions are the Options of one run, with the cases it met.
type suiteOptions struct {
	Options
	seen map[string]bool
}

func optionsOf(t *testing.T, opts []Options) *suiteOptions {
	t.Helper()
	if len(opts) > 1 {
		t.Fatalf("brokertest: %d Options given, want at most one", len(opts))
	}
	o := &suiteOptions{seen: make(map[string]bool)}
	if len(opts) == 1 {
		o.Options = opts[0]
	}
	return o
}

// checkNames fails t for a not-applicable name that is no case of the
// suite (a typo, or a case renamed).
func (o *suiteOptions) checkNames(t *testing.T) {
	for name := range o.NotApplicable {
		if !o.seen[name] {
			t.Errorf("brokertest: NotApplicable names %q, which is no case of this suite", name)
		}
	}
}

// runCases runs each case as a parallel subtest on a fresh S from newS;
// a case o names as not applicable logs its reason and passes.
func runCases[S any](t *testing.T, newS func(t *testing.T) S, o *suiteOptions, cases []testCase[S]) {
	for _, tc := range cases {
		o.seen[tc.name] = true
		t.Run(tc.name, func(t *testing.T) {
			if why, ok := o.NotApplicable[tc.name]; ok {
				t.Logf("not applicable to this broker: %s", why)
				return
			}
			t.Parallel()
			tc.fn(t, newS(t))
		})
	}
}

func testClosed(t *testing.T, b broker.Broker) {
	submitN(t, b, "c", 1)
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := b.Submit(ctxOf(t), broker.SubmitRequest{Topic: "c", Task: "x"}); !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("Submit after Close: %v, want ErrClosed", err)
	}
	if _, err := b.Claim(ctxOf(t), broker.ClaimRequest{WorkerID: "w", Topics: []string{"c"}, Max: 1}); !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("Claim after Close: %v, want ErrClosed", err)
	}
}
