package ui

// The dashboard's charts: an in-memory ring of per-minute samples of the
// broker's counts (queue depth) and of this process's task counters
// (throughput), over the last hour.
//
// The sampler belongs to one runtime: it starts with the first UI request
// after a Configure and stops within a second of that runtime being
// replaced or stopped (it polls Plugin.current). A new runtime starts a new
// ring, since it may talk to another broker. So the charts cover the time
// since the UI was first opened in this runtime, at most an hour.

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/plugins/tasksworker/service"
)

const (
	// uiSampleEvery is how often the sampler reads the broker's stats.
	uiSampleEvery  = 30 * time.Second
	uiChartMinutes = 60
	// uiStatsTimeout bounds the broker.Stats call of one sample.
	uiStatsTimeout = 5 * time.Second
)

// uiMinute is one minute of samples. Depths are the highest seen in the
// minute; Done and Failed count attempts that ended in it.
type uiMinute struct {
	At                    time.Time // the minute's start; zero: no sample
	Queued, Running, Dead int
	Done, Failed          float64
}

type uiSampler struct {
	mu           sync.Mutex
	ring         [uiChartMinutes]uiMinute
	last, since  time.Time
	done, failed float64
	counted      bool
}

// uiSamplers maps each live *runtime to its sampler.
var uiSamplers sync.Map

// sampler returns svc's sampler, starting it on first use.
func (u *UI) sampler(svc *service.Service) *uiSampler {
	if v, ok := uiSamplers.Load(svc); ok {
		return v.(*uiSampler)
	}
	s := &uiSampler{}
	if v, loaded := uiSamplers.LoadOrStore(svc, s); loaded {
		return v.(*uiSampler)
	}
	go u.runSampler(svc, s)
	return s
}

func (u *UI) runSampler(svc *service.Service, s *uiSampler) {
	defer uiSamplers.Delete(svc)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for range tick.C {
		if u.current() != svc {
			return
		}
		if !s.due(time.Now(), uiSampleEvery) {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), uiStatsTimeout)
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
func (s *uiSampler) due(now time.Time, every time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return now.Sub(s.last) >= every
}

// skip notes a failed sample, so the next try waits a full period.
func (s *uiSampler) skip(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = now
}

func uiSlot(m time.Time) int { return int((m.Unix() / 60) % uiChartMinutes) }

// record adds one sample: the broker's counts and this process's counters
// of finished attempts.
func (s *uiSampler) record(now time.Time, st broker.Stats, done, failed float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	minute := now.Truncate(time.Minute)
	b := &s.ring[uiSlot(minute)]
	if !b.At.Equal(minute) {
		*b = uiMinute{At: minute}
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
func (s *uiSampler) minutes(now time.Time) []uiMinute {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]uiMinute, uiChartMinutes)
	cur := now.Truncate(time.Minute)
	for i := range out {
		m := cur.Add(time.Duration(i-(uiChartMinutes-1)) * time.Minute)
		if b := s.ring[uiSlot(m)]; b.At.Equal(m) {
			out[i] = b
		}
	}
	return out
}

// uiChart is one small SVG line chart, laid out here so the template only
// prints numbers.
type uiChart struct {
	ID, Title, Note string
	W, H            int
	X0, X1, Y0, Y1  float64 // the plot area
	Ticks           []uiTick
	Series          []uiSeries // in legend order
	Draw            []uiSeries // in drawing order: the first series on top
}

type uiTick struct {
	Y     float64
	Label string
}

type uiSeries struct {
	Key, Name string
	Last      string
	Segments  []string // polyline points, one per run of sampled minutes
	Dots      []uiDot  // lone sampled minutes
}

type uiDot struct{ X, Y float64 }

func (s *uiSampler) charts(now time.Time) []uiChart {
	mins := s.minutes(now)
	s.mu.Lock()
	since := s.since
	s.mu.Unlock()
	note := "Sampled every " + uiDuration(uiSampleEvery) + " since " + uiWhen(since) + " (when this UI was first opened); highest depth in each minute."
	if since.IsZero() {
		note = "No samples yet."
	}
	depth := uiLineChart("depth", "Queue depth, last hour", mins, []uiSeriesSpec{
		{"queued", "queued", func(m uiMinute) float64 { return float64(m.Queued) }},
		{"running", "running", func(m uiMinute) float64 { return float64(m.Running) }},
		{"dead", "dead letters", func(m uiMinute) float64 { return float64(m.Dead) }},
	})
	depth.Note = note
	thr := uiLineChart("throughput", "Throughput per minute, last hour", mins, []uiSeriesSpec{
		{"done", "completed", func(m uiMinute) float64 { return m.Done }},
		{"failed", "failed", func(m uiMinute) float64 { return m.Failed }},
	})
	thr.Note = "Attempts finished by this process's workers in each minute."
	return []uiChart{depth, thr}
}

type uiSeriesSpec struct {
	key, name string
	value     func(uiMinute) float64
}

func uiLineChart(id, title string, mins []uiMinute, specs []uiSeriesSpec) uiChart {
	c := uiChart{ID: id, Title: title, W: 560, H: 150, X0: 40, X1: 552, Y0: 10, Y1: 128}
	top := 0.0
	for _, m := range mins {
		if m.At.IsZero() {
			continue
		}
		for _, sp := range specs {
			top = math.Max(top, sp.value(m))
		}
	}
	top = uiNiceCeil(top)
	y := func(v float64) float64 { return c.Y1 - (c.Y1-c.Y0)*v/top }
	x := func(i int) float64 { return c.X0 + (c.X1-c.X0)*float64(i)/float64(len(mins)-1) }
	for _, v := range []float64{0, top / 2, top} {
		c.Ticks = append(c.Ticks, uiTick{Y: y(v), Label: uiNumber(v)})
	}
	for _, sp := range specs {
		ser := uiSeries{Key: sp.key, Name: sp.name, Last: "–"}
		var run []string
		flush := func(i int) {
			switch len(run) {
			case 0:
			case 1:
				ser.Dots = append(ser.Dots, uiDot{X: x(i - 1), Y: y(sp.value(mins[i-1]))})
			default:
				ser.Segments = append(ser.Segments, strings.Join(run, " "))
			}
			run = nil
		}
		for i, m := range mins {
			if m.At.IsZero() {
				flush(i)
				continue
			}
			v := sp.value(m)
			run = append(run, fmt.Sprintf("%.1f,%.1f", x(i), y(v)))
			ser.Last = uiNumber(v)
		}
		flush(len(mins))
		c.Series = append(c.Series, ser)
	}
	for i := len(c.Series) - 1; i >= 0; i-- {
		c.Draw = append(c.Draw, c.Series[i])
	}
	return c
}

// uiNiceCeil rounds v up to 1, 2 or 5 times a power of ten (at least 1).
func uiNiceCeil(v float64) float64 {
	if v <= 1 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func uiNumber(v float64) string {
	if v == math.Trunc(v) {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}
