package rabbitmq

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/taskhost/taskhost/broker"
)

// BenchmarkBurnDown submits b.N messages in batches of 100, then 8
// claimers (Max 10, one Ack call per claim) run them down, on the
// postgres state store; it reports messages per second of the burn-down.
//
//	go test ./broker/rabbitmq -run '^$' -bench BurnDown -benchtime 2000x -count 3
func BenchmarkBurnDown(b *testing.B) {
	br := openTest(b, onPostgres, Options{})
	ctx := b.Context()
	const topic = "bench"
	for n := 0; n < b.N; {
		reqs := make([]broker.SubmitRequest, min(100, b.N-n))
		for i := range reqs {
			reqs[i] = broker.SubmitRequest{Topic: topic, Task: "noop"}
		}
		if _, err := br.SubmitMany(ctx, reqs); err != nil {
			b.Fatal(err)
		}
		n += len(reqs)
	}
	var done atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			worker := "w" + string(rune('a'+w))
			for done.Load() < int64(b.N) {
				ms, err := br.Claim(ctx, broker.ClaimRequest{WorkerID: worker, Topics: []string{topic}, Max: 10})
				if err != nil {
					b.Error(err)
					return
				}
				if len(ms) == 0 {
					continue
				}
				outs := make([]broker.Outcome, len(ms))
				for i, m := range ms {
					outs[i] = broker.Outcome{Claim: m.ClaimOf()}
				}
				if _, err := br.Ack(ctx, outs); err != nil {
					b.Error(err)
					return
				}
				done.Add(int64(len(ms)))
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}
