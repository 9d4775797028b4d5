package ui

// The dashboard's two SVG line charts (queue depth and throughput over the
// last hour), laid out from the sampler's minutes so the template only
// prints numbers.

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// chart is one small SVG line chart, laid out here so the template only
// prints numbers.
type chart struct {
	ID, Title, Note string
	W, H            int
	X0, X1, Y0, Y1  float64 // the plot area
	Ticks           []tick
	Series          []series // in legend order
	Draw            []series // in drawing order: the first series on top
}

type tick struct {
	Y     float64
	Label string
}

type series struct {
	Key, Name string
	Last      string
	Segments  []string // polyline points, one per run of sampled minutes
	Dots      []dot    // lone sampled minutes
}

type dot struct{ X, Y float64 }

func (s *sampleRing) charts(now time.Time) []chart {
	mins := s.minutes(now)
	s.mu.Lock()
	since := s.since
	s.mu.Unlock()
	note := "Sampled every " + duration(sampleEvery) + " since " + when(since) + " (when this UI was first opened); highest depth in each minute."
	if since.IsZero() {
		note = "No samples yet."
	}
	depth := lineChart("depth", "Queue depth, last hour", mins, []seriesSpec{
		{"queued", "queued", func(m minuteSample) float64 { return float64(m.Queued) }},
		{"running", "running", func(m minuteSample) float64 { return float64(m.Running) }},
		{"dead", "dead letters", func(m minuteSample) float64 { return float64(m.Dead) }},
	})
	depth.Note = note
	thr := lineChart("throughput", "Throughput per minute, last hour", mins, []seriesSpec{
		{"done", "completed", func(m minuteSample) float64 { return m.Done }},
		{"failed", "failed", func(m minuteSample) float64 { return m.Failed }},
	})
	thr.Note = "Attempts finished by this process's workers in each minute."
	return []chart{depth, thr}
}

type seriesSpec struct {
	key, name string
	value     func(minuteSample) float64
}

func lineChart(id, title string, mins []minuteSample, specs []seriesSpec) chart {
	c := chart{ID: id, Title: title, W: 560, H: 150, X0: 40, X1: 552, Y0: 10, Y1: 128}
	top := 0.0
	for _, m := range mins {
		if m.At.IsZero() {
			continue
		}
		for _, sp := range specs {
			top = math.Max(top, sp.value(m))
		}
	}
	top = niceCeil(top)
	y := func(v float64) float64 { return c.Y1 - (c.Y1-c.Y0)*v/top }
	x := func(i int) float64 { return c.X0 + (c.X1-c.X0)*float64(i)/float64(len(mins)-1) }
	for _, v := range []float64{0, top / 2, top} {
		c.Ticks = append(c.Ticks, tick{Y: y(v), Label: number(v)})
	}
	for _, sp := range specs {
		ser := series{Key: sp.key, Name: sp.name, Last: "–"}
		var run []string
		flush := func(i int) {
			switch len(run) {
			case 0:
			case 1:
				ser.Dots = append(ser.Dots, dot{X: x(i - 1), Y: y(sp.value(mins[i-1]))})
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
			ser.Last = number(v)
		}
		flush(len(mins))
		c.Series = append(c.Series, ser)
	}
	for i := len(c.Series) - 1; i >= 0; i-- {
		c.Draw = append(c.Draw, c.Series[i])
	}
	return c
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten (at least 1).
func niceCeil(v float64) float64 {
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

func number(v float64) string {
	if v == math.Trunc(v) {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}
