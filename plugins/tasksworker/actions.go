package tasksworker

// The plugin's operator actions (capability.ActionProvider): the reclaim
// pass, through the service.

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/taskhost/taskhost/capability"
)

// ActionReclaim is the id of the "reclaim orphaned messages now" action.
const ActionReclaim = "reclaim_orphaned_messages"

// ListActions implements capability.ActionProvider.
func (p *Plugin) ListActions(context.Context) ([]capability.ActionSpec, error) {
	return []capability.ActionSpec{{
		ID:    ActionReclaim,
		Title: "Reclaim orphaned messages now",
		Description: "Runs one orphan-reclaim pass: running messages whose worker stopped heartbeating are requeued " +
			"(or dead-lettered past their attempt limit) and the locks such workers held are released. " +
			"It fails closed: when the live-worker set cannot be trusted it changes nothing.",
		Confirm:        true,
		TimeoutSeconds: 30,
	}}, nil
}

// InvokeAction implements capability.ActionProvider. The reclaim action
// calls the reaper's pass directly, not through the queue, so it works
// while a topic is wedged.
func (p *Plugin) InvokeAction(ctx context.Context, req capability.ActionRequest) (capability.ActionResult, error) {
	if req.ActionID != ActionReclaim {
		return capability.ActionResult{}, fmt.Errorf("action %q (tasks_worker has %s): %w", req.ActionID, ActionReclaim, capability.ErrNotFound)
	}
	rt := p.current()
	if rt == nil {
		return capability.ActionResult{}, fmt.Errorf("tasks_worker is not running: %w", capability.ErrUnavailable)
	}
	res := rt.svc.Reclaim(ctx)
	body, err := json.Marshal(res)
	if err != nil {
		return capability.ActionResult{}, err
	}
	p.log.Info("reclaim pass requested by an operator", "actor", req.Actor, "result", res.Summary())
	return capability.ActionResult{Message: res.Summary(), Result: body}, nil
}
