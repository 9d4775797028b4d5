package ui

// The samples behind the dashboard's charts (charts.go): an in-memory ring
// of per-minute samples of the broker's counts (queue depth) and of this
// process's task counters (throughput), over the last hour.
//
// The sampler belongs to one running service: it starts with the first UI
// request after a Configure and stops within a second of that service
// being replaced or stopped (it polls Options.Current). A new service
// starts a new ring, since it may talk to another broker. So the charts cover the time
// since the UI was first opened in this runtime, at most an hour.

import (
	"context"
	"sync"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/plugins/tasksworker/service"
)

const (
	// sampleEvery is how often the sampler reads the broker's stats.
	sampleEvery  = 30 * time.Second
	chartMinutes = 60
	// statsTimeout bounds the broker.Stats call of one sample.
	statsTimeout = 5 * time.Second
)

// minuteSample is one minute of samples. Depths are the highest seen in the
// minute; Done and Failed count attempts that ended in it.
type minuteSample struct {
	At                    time.Time // the minute's start; zero: no sample
	Queued, Running, Dead int
	Done, Failed          float64
}

type sampleRing struct {
	mu           sync.Mutex
	ring         [chartMinutes]minuteSample
	last, since  time.Time
	done, failed float64
	counted      bool
}

// samplers maps each live *service.Service to its sampler.
var samplers sync.Map

// sampler returns svc's sampler, starting it on first use.
func (u *UI) sampler(svc *service.Service) *sampleRing {
	if v, ok := samplers.Load(svc); ok {
		return v.(*sampleRing)
	}
	s := &sampleRing{}
	if v, loaded := samplers.LoadOrStore(svc, s); loaded {
		return v.(*sampleRing)
	}
	go u.runSampler(svc, s)
	return s
}

func (u *UI) runSampler(svc *service.Service, s *sampleRing) {
	defer samplers.Delete(svc)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for range tick.C {
		if u.current() != svc {
			return
		}
		if !s.due(time.Now(), sampleEvery) {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), statsTimeout)
		st, err := svc.Stats(ctx)
		cancel()
		if err != nil {
			// A gap in the chart says it; the dashboard says why.
			s.skip(time.Now())
			continue
		}
		done, failed := u.throughput()
		s.record(time.Now(), st, done, failed)
	}
}

// due says whether the last sample is at least every old.
func (s *sampleRing) due(now time.Time, every time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return now.Sub(s.last) >= every
}

// skip notes a failed sample, so the next try waits a full period.
func (s *sampleRing) skip(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = now
}

func slot(m time.Time) int { return int((m.Unix() / 60) % chartMinutes) }

// record adds one sample: the broker's counts and this process's counters
// of finished attempts.
func (s *sampleRing) record(now time.Time, st broker.Stats, done, failed float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	minute := now.Truncate(time.Minute)
	b := &s.ring[slot(minute)]
	if !b.At.Equal(minute) {
		*b = minuteSample{At: minute}
	}
	var q, run, dead int
	for _, t := range st.Topics {
		q, run, dead = q+t.Queued, run+t.Running, dead+t.DeadLetter
	}
	b.Queued, b.Running, b.Dead = max(b.Queued, q), max(b.Running, run), max(b.Dead, dead)
	if s.counted {
		b.Done += max(0, done-s.done)
		b.Failed += max(0, failed-s.failed)
	}
	s.done, s.failed, s.counted = done, failed, true
	s.last = now
	if s.since.IsZero() {
		s.since = now
	}
}

// minutes returns the last hour, oldest first; a minute without a sample
// has a zero At.
func (s *sampleRing) minutes(now time.Time) []minuteSample {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]minuteSample, chartMinutes)
	cur := now.Truncate(time.Minute)
	for i := range out {
		m := cur.Add(time.Duration(i-(chartMinutes-1)) * time.Minute)
		if b := s.ring[slot(m)]; b.At.Equal(m) {
			out[i] = b
		}
	}
	return out
}
