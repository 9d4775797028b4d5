package broker

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// ScheduleHeader is the header FireSchedule sets on the message it
// submits: the name of the schedule that fired it.
const ScheduleHeader = "schedule"

// SourceAPI is the source a schedule gets when none is given.
const SourceAPI = "api"

// ReportStatuses are the statuses a report may have.
var ReportStatuses = []string{ReportSuccess, ReportFailed, ReportError, ReportTimeout, ReportCancelled, ReportSkipped, ReportLost, ReportSnoozed}

// NormalizeSchedule checks a schedule's definition and returns it as every
// broker stores it. Errors wrap ErrInvalid and say what is wrong.
//
//   - Name is not empty and at most MaxScheduleNameLen characters.
//   - Task is not empty; Topic passes ValidateTopicName.
//   - Payload is valid JSON of at most MaxPayloadSize bytes; empty becomes {}.
//   - Exactly one of IntervalSeconds > 0 and Cron (not blank; surrounding
//     spaces are trimmed) is set; a negative interval, or one above
//     MaxIntervalSeconds, is invalid. The store does not parse Cron: the
//     scheduler validates it first.
//   - MissedPolicy "" becomes MissedSkip; otherwise it is MissedSkip or
//     MissedFireOnce.
//   - Source "" becomes SourceAPI.
//
// The run state (LastAttempt, LastSuccess, ExpectedNextRun, NextFireAt) and the
// CreatedAt and UpdatedAt stamps are cleared: the store keeps its own.
func NormalizeSchedule(s Schedule) (Schedule, error) {
	switch n := utf8.RuneCountInString(s.Name); {
	case s.Name == "":
		return Schedule{}, Invalid("schedule name is empty")
	case n > MaxScheduleNameLen:
		return Schedule{}, Invalid("schedule name is %d characters long, the limit is %d", n, MaxScheduleNameLen)
	}
	if s.Task == "" {
		return Schedule{}, Invalid("schedule %q: task is empty", s.Name)
	}
	if len(s.Task) > MaxTaskLen {
		return Schedule{}, Invalid("schedule %q: task name is %d bytes long, the limit is %d", s.Name, len(s.Task), MaxTaskLen)
	}
	if err := ValidateTopicName(s.Topic); err != nil {
		return Schedule{}, Invalid("schedule %q: %s", s.Name, strings.TrimPrefix(err.Error(), ErrInvalid.Error()+": "))
	}
	if len(s.Payload) == 0 {
		s.Payload = json.RawMessage(`{}`)
	} else {
		if len(s.Payload) > MaxPayloadSize {
			return Schedule{}, Invalid("schedule %q: payload is %d bytes, the limit is %d", s.Name, len(s.Payload), MaxPayloadSize)
		}
		if err := CheckJSON(s.Payload); err != nil {
			return Schedule{}, Invalid("schedule %q: payload: %v", s.Name, err)
		}
		s.Payload = slices.Clone(s.Payload)
	}
	if len(s.UniqueKey) > MaxUniqueKeyLen {
		return Schedule{}, Invalid("schedule %q: unique_key is %d bytes long, the limit is %d", s.Name, len(s.UniqueKey), MaxUniqueKeyLen)
	}
	s.Cron = strings.TrimSpace(s.Cron)
	switch {
	case s.IntervalSeconds < 0:
		return Schedule{}, Invalid("schedule %q: interval_seconds is negative (%d)", s.Name, s.IntervalSeconds)
	case s.IntervalSeconds > MaxIntervalSeconds:
		return Schedule{}, Invalid("schedule %q: interval_seconds %d is above the limit %d", s.Name, s.IntervalSeconds, MaxIntervalSeconds)
	case s.IntervalSeconds > 0 && s.Cron != "":
		return Schedule{}, Invalid("schedule %q: both interval_seconds and cron are set; set exactly one", s.Name)
	case s.IntervalSeconds == 0 && s.Cron == "":
		return Schedule{}, Invalid("schedule %q: neither interval_seconds nor cron is set; set exactly one", s.Name)
	}
	switch s.MissedPolicy {
	case "":
		s.MissedPolicy = MissedSkip
	case MissedSkip, MissedFireOnce:
	default:
		return Schedule{}, Invalid("schedule %q: missed_policy %q is unknown (want %q or %q)",
			s.Name, s.MissedPolicy, MissedSkip, MissedFireOnce)
	}
	if s.Source == "" {
		s.Source = SourceAPI
	}
	s.LastAttempt, s.LastSuccess, s.ExpectedNextRun, s.NextFireAt = nil, nil, nil, nil
	s.CreatedAt, s.UpdatedAt = time.Time{}, time.Time{}
	return s, nil
}

// ValidateFire checks a fire request: a schedule name and a slot, and the
// message to submit, if any, as Submit would, but for the payload's size:
// that was checked when the schedule was stored (CheckSchedulePayload),
// and the store may give the payload back a little larger than it was
// given (PostgreSQL's jsonb adds spaces): a schedule must not stop firing
// over that.
func ValidateFire(req FireRequest) error {
	if req.Name == "" {
		return Invalid("schedule name is empty")
	}
	if req.Slot.IsZero() {
		return Invalid("schedule %q: the slot to fire is not set", req.Name)
	}
	if req.Submit != nil {
		if err := ValidateSubmit(*req.Submit, math.MaxInt); err != nil {
			return err
		}
	}
	return nil
}

// ValidateFires checks the requests of FireSchedules: at most
// MaxFireBatch, each valid (ValidateFire), and one fence for all (the
// same, or none); it returns that fence.
func ValidateFires(reqs []FireRequest) (*Fence, error) {
	if len(reqs) > MaxFireBatch {
		return nil, Invalid("%d fire requests, the limit is %d", len(reqs), MaxFireBatch)
	}
	var fence *Fence
	for i, r := range reqs {
		if err := ValidateFire(r); err != nil {
			return nil, fmt.Errorf("fire request %d of %d: %w", i+1, len(reqs), err)
		}
		switch {
		case r.Fence == nil:
		case fence == nil:
			fence = r.Fence
		case *fence != *r.Fence:
			return nil, Invalid("fire request %d of %d: its fence differs from the others'", i+1, len(reqs))
		}
	}
	for i, r := range reqs {
		if fence != nil && r.Fence == nil {
			return nil, Invalid("fire request %d of %d has no fence, others have one", i+1, len(reqs))
		}
	}
	return fence, nil
}

// CheckSchedulePayload refuses a schedule whose payload is larger than
// maxPayload, the largest payload the store's Submit takes (0 means
// MaxPayloadSize, which NormalizeSchedule checks already): what a
// schedule fires must be what could be submitted.
func CheckSchedulePayload(s Schedule, maxPayload int) error {
	if maxPayload > 0 && len(s.Payload) > maxPayload {
		return Invalid("schedule %q: payload is %d bytes, the limit is %d", s.Name, len(s.Payload), maxPayload)
	}
	return nil
}

// FireSubmit returns the message FireSchedule submits for req (whose
// Submit is not nil): req.Submit with its headers copied and
// ScheduleHeader set to the schedule's name.
func FireSubmit(req FireRequest) SubmitRequest {
	sub := *req.Submit
	h := make(map[string]string, len(sub.Headers)+1)
	maps.Copy(h, sub.Headers)
	h[ScheduleHeader] = req.Name
	sub.Headers = h
	return sub
}

// ValidateReport checks a report: its status is one of ReportStatuses and
// its result, when set, is valid JSON.
func ValidateReport(r Report) error {
	if !slices.Contains(ReportStatuses, r.Status) {
		return Invalid("report status %q is unknown (want one of %v)", r.Status, ReportStatuses)
	}
	if len(r.Result) > 0 {
		if err := CheckJSON(r.Result); err != nil {
			return Invalid("report result: %v", err)
		}
	}
	return nil
}

// ValidateReports checks reports as ValidateReport does; the error of the
// first invalid one says which it is.
func ValidateReports(rs []Report) error {
	for i, r := range rs {
		if err := ValidateReport(r); err != nil {
			if len(rs) == 1 {
				return err
			}
			return fmt.Errorf("report %d of %d (message %d): %w", i+1, len(rs), r.MessageID, err)
		}
	}
	return nil
}

// OneReport is AddReport made of AddReports: the id of the one report
// stored by a call of AddReports with just it, or that call's error.
func OneReport(ids []int64, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return ids[0], nil
}

// ValidateReportFilter checks a report filter (a status, when set, must be
// known) and returns the limit to apply.
func ValidateReportFilter(f ReportFilter) (int, error) {
	if f.Status != "" && !slices.Contains(ReportStatuses, f.Status) {
		return 0, Invalid("report status %q is unknown (want one of %v)", f.Status, ReportStatuses)
	}
	limit := f.Limit
	if limit <= 0 {
		limit = DefaultReportLimit
	}
	return min(limit, MaxReportLimit), nil
}
