package memory

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// DefaultReportRetain is how many reports the memory broker keeps: past it
// the oldest are dropped.
const DefaultReportRetain = 100000

// AddReport validates r (broker.ValidateReport) and stores it under a new
// id, which it returns. A zero EndedAt is now and a zero StartedAt is
// EndedAt; Logs is copied (empty reads back as nil). A success report
// naming a schedule (r.Schedule) also sets that schedule's LastSuccess to
// the later of it and EndedAt; a schedule that no longer exists is not an
// error. Past DefaultReportRetain reports the oldest are dropped.
func (b *Broker) AddReport(ctx context.Context, r broker.Report) (int64, error) {
	return broker.OneReport(b.AddReports(ctx, []broker.Report{r}))
}

// AddReports stores reports as AddReport does, all at once. A report
// whose key (broker.Report.Key) is stored already is not stored again: the
// stored report's id stands for it.
func (b *Broker) AddReports(ctx context.Context, rs []broker.Report) ([]int64, error) {
	if err := broker.ValidateReports(rs); err != nil || len(rs) == 0 {
		return nil, err
	}
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()
	return b.addReports(rs), nil
}

// addReports stores validated reports as AddReports does; b.mu is held.
func (b *Broker) addReports(rs []broker.Report) []int64 {
	st := b.st()
	ids := make([]int64, len(rs))
	for i, r := range rs {
		if id, ok := st.keys[r.Key]; ok && r.Key != "" {
			ids[i] = id // stored already
			continue
		}
		if r.EndedAt.IsZero() {
			r.EndedAt = b.now()
		}
		if r.StartedAt.IsZero() {
			r.StartedAt = r.EndedAt
		}
		st.reportID++
		r.ID = st.reportID
		ids[i] = r.ID
		key := r.Key
		r = copyReport(&r)
		if key != "" {
			r.Key = key
			if st.keys == nil {
				st.keys = make(map[string]int64)
			}
			st.keys[key] = r.ID
		}
		st.reports = append(st.reports, r)
		if s := st.schedules[r.Schedule]; r.Schedule != "" && r.Status == broker.ReportSuccess && s != nil {
			if s.LastSuccess == nil || r.EndedAt.After(*s.LastSuccess) {
				t := r.EndedAt
				s.LastSuccess = &t
			}
		}
	}
	if n := len(st.reports) - DefaultReportRetain; n > 0 {
		// Reslicing is O(1); append copies the survivors to a new array
		// now and then, and the dropped ones are zeroed for the GC.
		for _, r := range st.reports[:n] {
			delete(st.keys, r.Key)
		}
		clear(st.reports[:n])
		st.reports = st.reports[n:]
	}
	return ids
}

// ListReports returns the reports matching f, newest (highest id) first:
// at most f.Limit (broker.DefaultReportLimit when not positive,
// broker.MaxReportLimit at most), with ids below f.Before when it is
// positive. An unknown status is invalid.
func (b *Broker) ListReports(ctx context.Context, f broker.ReportFilter) ([]broker.Report, error) {
	limit, err := broker.ValidateReportFilter(f)
	if err != nil {
		return nil, err
	}
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()

	reports := b.st().reports
	i := len(reports)
	if f.Before > 0 {
		i = sort.Search(len(reports), func(i int) bool { return reports[i].ID >= f.Before })
	}
	out := []broker.Report{}
	for i--; i >= 0 && len(out) < limit; i-- {
		r := &reports[i]
		if (f.MessageID != 0 && r.MessageID != f.MessageID) ||
			(f.Task != "" && r.Task != f.Task) ||
			(f.Status != "" && r.Status != f.Status) ||
			(f.Schedule != "" && r.Schedule != f.Schedule) {
			continue
		}
		out = append(out, copyReport(r))
	}
	return out, nil
}

// GetReport returns the report; broker.ErrNotFound when there is none with
// that id (never stored, purged or dropped).
func (b *Broker) GetReport(ctx context.Context, id int64) (broker.Report, error) {
	if err := b.begin(ctx); err != nil {
		return broker.Report{}, err
	}
	defer b.mu.Unlock()

	reports := b.st().reports
	i := sort.Search(len(reports), func(i int) bool { return reports[i].ID >= id })
	if i == len(reports) || reports[i].ID != id {
		return broker.Report{}, fmt.Errorf("report %d: %w", id, broker.ErrNotFound)
	}
	return copyReport(&reports[i]), nil
}

// PurgeReports deletes the reports that ended before the cutoff and
// returns how many.
func (b *Broker) PurgeReports(ctx context.Context, before time.Time) (int, error) {
	if err := b.begin(ctx); err != nil {
		return 0, err
	}
	defer b.mu.Unlock()

	st := b.st()
	n := len(st.reports)
	st.reports = slices.DeleteFunc(st.reports, func(r broker.Report) bool {
		if r.EndedAt.Before(before) {
			delete(st.keys, r.Key)
			return true
		}
		return false
	})
	return n - len(st.reports), nil
}

// copyReport copies r but for its key, which reads leave empty.
func copyReport(r *broker.Report) broker.Report {
	c := *r
	c.Key = ""
	if len(r.Result) > 0 {
		c.Result = slices.Clone(r.Result)
	} else {
		c.Result = nil
	}
	if len(r.Logs) > 0 {
		c.Logs = slices.Clone(r.Logs)
	} else {
		c.Logs = nil
	}
	return c
}
