package tasksworker

// Tasks other plugins submit through the host (capability.TaskSubmitter):
// from a provider's task (capability.Submit), or from any plugin.

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/plugins/tasksworker/service"
)

var _ capability.TaskSubmitter = (*Plugin)(nil)

// SubmitTasks queues tasks for plugin, all or none, each recorded as
// submitted by it (broker.SubmitterHeader) and with its parent, when it
// names one (broker.ParentHeader). A refused task is an
// *InvalidArgumentError naming it; a task system that is not running is
// ErrUnavailable.
func (p *Plugin) SubmitTasks(ctx context.Context, plugin string, tasks []capability.TaskSubmission) ([]capability.SubmittedTask, error) {
	rt := p.current()
	if rt == nil {
		return nil, fmt.Errorf("tasks_worker is not running (starting, stopping, or its broker is down): %w", capability.ErrUnavailable)
	}
	if len(tasks) == 0 {
		return nil, &capability.InvalidArgumentError{Msg: "no task to submit"}
	}
	reqs := make([]service.SubmitRequest, len(tasks))
	for i, t := range tasks {
		req, err := submitRequestOf(plugin, t)
		if err != nil {
			return nil, &capability.InvalidArgumentError{Msg: fmt.Sprintf("task %d (%s): %v", i+1, t.Task, err)}
		}
		reqs[i] = req
	}
	out, err := rt.svc.SubmitMany(ctx, reqs)
	var item *service.ItemError
	switch {
	case errors.As(err, &item):
		return nil, submitRefusal(fmt.Sprintf("task %d (%s): ", item.Index+1, tasks[item.Index].Task), item.Err)
	case err != nil:
		return nil, submitRefusal("", err)
	}
	res := make([]capability.SubmittedTask, len(out))
	for i, s := range out {
		res[i] = capability.SubmittedTask{ID: strconv.FormatInt(s.ID, 10), Duplicate: s.Duplicate}
	}
	return res, nil
}

// submitRequestOf is the service's request for one plugin's submission.
func submitRequestOf(plugin string, t capability.TaskSubmission) (service.SubmitRequest, error) {
	if t.Delay > 0 && !t.RunAt.IsZero() {
		return service.SubmitRequest{}, errors.New("give a delay or a run_at, not both")
	}
	headers := map[string]string{broker.SubmitterHeader: "plugin:" + plugin}
	if t.ParentTaskID != "" {
		if id, err := strconv.ParseInt(t.ParentTaskID, 10, 64); err != nil || id <= 0 {
			return service.SubmitRequest{}, fmt.Errorf("parent_task_id %q is not a task id", t.ParentTaskID)
		}
		headers[broker.ParentHeader] = t.ParentTaskID
	}
	return service.SubmitRequest{
		Task: t.Task, Topic: t.Topic, Payload: t.Payload,
		DelaySeconds: t.Delay.Seconds(), RunAt: t.RunAt,
		MaxAttempts: t.MaxAttempts, Priority: t.Priority,
		UniqueKey: t.UniqueKey, UniqueKeySet: t.UniqueKey != "",
		UniqueForSeconds: t.UniqueFor.Seconds(), UniqueStates: t.UniqueStates,
		Headers: headers,
	}, nil
}

// submitRefusal is the error a plugin's submit gets: bad input as an
// *InvalidArgumentError, a passing failure as ErrUnavailable, anything
// else with its message.
func submitRefusal(prefix string, err error) error {
	if p, ok := service.IsProblem(err); ok {
		if errors.Is(p, service.ErrUnavailable) {
			return fmt.Errorf("%s%s: %w", prefix, p.Msg, capability.ErrUnavailable)
		}
		return &capability.InvalidArgumentError{Msg: prefix + p.Msg}
	}
	if errors.Is(err, broker.ErrInvalid) {
		return &capability.InvalidArgumentError{Msg: prefix + err.Error()}
	}
	return fmt.Errorf("%ssubmit: %w", prefix, err)
}
