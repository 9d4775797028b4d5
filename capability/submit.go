package capability

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/taskhost/taskhost/capability/internal/pb"
)

// Submitting tasks from a plugin: HostServices.SubmitTasks on the plugin's
// side, the host's relay to the plugin that takes submits (TaskSubmitter,
// tasks_worker), and Submit, which a task calls from its own context.

// ErrNotInTask is returned by Submit called outside a provider's RunTask.
var ErrNotInTask = errors.New("capability.Submit: the context is not a task's (call it with the context RunTask was given, or use HostServices.SubmitTasks)")

// Submit queues tasks from inside a provider's task, as the plugin that
// runs it, each recorded with the running task as its parent (unless it
// names another): ctx must be the context RunTask was given, or one made
// from it. All of them are queued, or none and an error: an
// *InvalidArgumentError for a task the task system refuses, ErrUnavailable
// while the task system does not run.
func Submit(ctx context.Context, tasks ...TaskSubmission) ([]SubmittedTask, error) {
	sc, ok := ctx.Value(taskScopeKey{}).(*taskScope)
	if !ok || sc.host == nil {
		return nil, ErrNotInTask
	}
	subs := make([]TaskSubmission, len(tasks))
	for i, t := range tasks {
		if t.ParentTaskID == "" {
			t.ParentTaskID = sc.messageID
		}
		subs[i] = t
	}
	return sc.host.SubmitTasks(ctx, subs)
}

// taskScope is what a provider's task context carries for Submit.
type taskScope struct {
	host      HostServices
	messageID string
}

type taskScopeKey struct{}

// withTaskScope makes ctx the context of a task run with id messageID, in
// a plugin whose host services are host (nil before Configure).
func withTaskScope(ctx context.Context, host HostServices, messageID string) context.Context {
	if host == nil {
		return ctx
	}
	return context.WithValue(ctx, taskScopeKey{}, &taskScope{host: host, messageID: messageID})
}

func submissionsToPB(tasks []TaskSubmission) []*pb.TaskSubmission {
	out := make([]*pb.TaskSubmission, len(tasks))
	for i, t := range tasks {
		p := &pb.TaskSubmission{
			Task: t.Task, Topic: t.Topic, PayloadJson: t.Payload, DelaySeconds: t.Delay.Seconds(),
			MaxAttempts: int32(t.MaxAttempts), Priority: int32(t.Priority),
			UniqueKey: t.UniqueKey, UniqueKeySet: t.UniqueKey != "", UniqueForSeconds: t.UniqueFor.Seconds(),
			UniqueStates: t.UniqueStates, ParentTaskId: t.ParentTaskID,
		}
		if !t.RunAt.IsZero() {
			p.RunAt = t.RunAt.UTC().Format(time.RFC3339Nano)
		}
		out[i] = p
	}
	return out
}

// submissionsFromPB reads submissions off the wire; a run_at that is not
// RFC 3339 is bad input.
func submissionsFromPB(in []*pb.TaskSubmission) ([]TaskSubmission, error) {
	out := make([]TaskSubmission, len(in))
	for i, p := range in {
		t := TaskSubmission{
			Task: p.Task, Topic: p.Topic, Payload: p.PayloadJson, Delay: secondsToDuration(p.DelaySeconds),
			MaxAttempts: int(p.MaxAttempts), Priority: int(p.Priority),
			UniqueKey: p.UniqueKey, UniqueFor: secondsToDuration(p.UniqueForSeconds),
			UniqueStates: p.UniqueStates, ParentTaskID: p.ParentTaskId,
		}
		if p.RunAt != "" {
			at, err := time.Parse(time.RFC3339Nano, p.RunAt)
			if err != nil {
				return nil, &InvalidArgumentError{Msg: fmt.Sprintf("task %d: run_at %q is not an RFC 3339 time", i+1, p.RunAt)}
			}
			t.RunAt = at
		}
		out[i] = t
	}
	return out, nil
}

func submittedToPB(res []SubmittedTask) *pb.SubmitTasksResponse {
	out := &pb.SubmitTasksResponse{Tasks: make([]*pb.SubmittedTask, len(res))}
	for i, r := range res {
		out.Tasks[i] = &pb.SubmittedTask{Id: r.ID, Duplicate: r.Duplicate}
	}
	return out
}

func submittedFromPB(r *pb.SubmitTasksResponse) []SubmittedTask {
	out := make([]SubmittedTask, len(r.Tasks))
	for i, t := range r.Tasks {
		out[i] = SubmittedTask{ID: t.Id, Duplicate: t.Duplicate}
	}
	return out
}

// SubmitTasks hands the submits of plugin to this plugin, which takes
// submits (TaskSubmitter).
func (c *Client) SubmitTasks(ctx context.Context, plugin string, tasks []TaskSubmission) ([]SubmittedTask, error) {
	r, err := c.submit.SubmitTasks(ctx, &pb.SubmitTasksRequest{Tasks: submissionsToPB(tasks), Plugin: plugin})
	if err != nil {
		return nil, fromStatus("submit tasks", err)
	}
	return submittedFromPB(r), nil
}

func (h *hostServicesClient) SubmitTasks(ctx context.Context, tasks []TaskSubmission) ([]SubmittedTask, error) {
	r, err := h.c.SubmitTasks(ctx, &pb.SubmitTasksRequest{Tasks: submissionsToPB(tasks)})
	if err != nil {
		return nil, fromStatus("submit tasks", err)
	}
	return submittedFromPB(r), nil
}

func (s *hostServicesServer) SubmitTasks(ctx context.Context, req *pb.SubmitTasksRequest) (*pb.SubmitTasksResponse, error) {
	subs, err := submissionsFromPB(req.Tasks)
	if err != nil {
		return nil, toStatus(err)
	}
	res, err := s.impl.SubmitTasks(ctx, subs)
	if err != nil {
		return nil, toStatus(err)
	}
	return submittedToPB(res), nil
}

// submitServer serves a TaskSubmitter (tasks_worker) to the host.
type submitServer struct {
	pb.UnimplementedTaskSubmitterServer
	impl TaskSubmitter
}

func (s *submitServer) SubmitTasks(ctx context.Context, req *pb.SubmitTasksRequest) (*pb.SubmitTasksResponse, error) {
	subs, err := submissionsFromPB(req.Tasks)
	if err != nil {
		return nil, toStatus(err)
	}
	res, err := s.impl.SubmitTasks(ctx, req.Plugin, subs)
	if err != nil {
		return nil, toStatus(err)
	}
	return submittedToPB(res), nil
}
