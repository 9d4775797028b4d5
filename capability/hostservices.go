package capability

import (
	"context"
	"encoding/json"

	"github.com/taskhost/taskhost/capability/internal/pb"
)

// hostServicesServer serves a HostServices value (on the host) over gRPC.
type hostServicesServer struct {
	pb.UnimplementedHostServicesServer
	impl HostServices
}

func (s *hostServicesServer) ListPlugins(ctx context.Context, req *pb.ListPluginsRequest) (*pb.ListPluginsResponse, error) {
	list, err := s.impl.ListPlugins(ctx, Capability(req.Capability))
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &pb.ListPluginsResponse{}
	for _, p := range list {
		info := &pb.PluginInfo{Name: p.Name, Version: p.Version, State: p.State}
		for _, c := range p.Capabilities {
			info.Capabilities = append(info.Capabilities, string(c))
		}
		resp.Plugins = append(resp.Plugins, info)
	}
	return resp, nil
}

func (s *hostServicesServer) CollectMetrics(ctx context.Context, req *pb.HostCollectMetricsRequest) (*pb.CollectMetricsResponse, error) {
	m, err := s.impl.CollectMetrics(ctx, req.Plugin)
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.CollectMetricsResponse{Payload: m.Body, Format: m.Format}, nil
}

func (s *hostServicesServer) RunTask(req *pb.HostRunTaskRequest, stream pb.HostServices_RunTaskServer) error {
	r := req.Request
	if r == nil {
		r = &pb.RunTaskRequest{}
	}
	ev := &streamEvents{send: stream.Send}
	res, err := s.impl.RunTask(stream.Context(), req.Plugin, TaskRun{
		Task: r.Task, Payload: r.PayloadJson, MessageID: r.MessageId, Attempt: int(r.Attempt),
	}, ev)
	var te *TaskError
	if err != nil && !asTaskError(err, &te) {
		// Transport or routing failure: report it as a gRPC error so the
		// caller can tell it from the task's own failure.
		return toStatus(err)
	}
	// The task's own failure passes on with its outcome (snooze,
	// permanent, cancel), so a plugin that runs another's task sees what
	// that task asked for.
	final := &pb.RunTaskEvent{Done: true, ResultJson: res}
	if te != nil {
		final = finalEvent(res, te)
	}
	ev.mu.Lock()
	defer ev.mu.Unlock()
	return stream.Send(final)
}

func (s *hostServicesServer) ListTasks(ctx context.Context, req *pb.HostListTasksRequest) (*pb.ListTasksResponse, error) {
	specs, err := s.impl.ListTasks(ctx, req.Plugin)
	if err != nil {
		return nil, toStatus(err)
	}
	return tasksToPB(specs), nil
}

// hostServicesClient is the plugin's view of HostServices.
type hostServicesClient struct {
	c pb.HostServicesClient
}

func (h *hostServicesClient) ListPlugins(ctx context.Context, c Capability) ([]PluginInfo, error) {
	r, err := h.c.ListPlugins(ctx, &pb.ListPluginsRequest{Capability: string(c)})
	if err != nil {
		return nil, fromStatus("list plugins", err)
	}
	out := make([]PluginInfo, 0, len(r.Plugins))
	for _, p := range r.Plugins {
		info := PluginInfo{Name: p.Name, Version: p.Version, State: p.State}
		for _, c := range p.Capabilities {
			info.Capabilities = append(info.Capabilities, Capability(c))
		}
		out = append(out, info)
	}
	return out, nil
}

func (h *hostServicesClient) CollectMetrics(ctx context.Context, plugin string) (MetricsPayload, error) {
	r, err := h.c.CollectMetrics(ctx, &pb.HostCollectMetricsRequest{Plugin: plugin})
	if err != nil {
		return MetricsPayload{}, fromStatus("collect metrics of "+plugin, err)
	}
	return MetricsPayload{Body: r.Payload, Format: r.Format}, nil
}

func (h *hostServicesClient) ListTasks(ctx context.Context, plugin string) ([]TaskSpec, error) {
	r, err := h.c.ListTasks(ctx, &pb.HostListTasksRequest{Plugin: plugin})
	if err != nil {
		return nil, fromStatus("list tasks of "+plugin, err)
	}
	return tasksFromPB(r), nil
}

func (h *hostServicesClient) RunTask(ctx context.Context, plugin string, run TaskRun, events TaskEvents) (json.RawMessage, error) {
	stream, err := h.c.RunTask(ctx, &pb.HostRunTaskRequest{Plugin: plugin, Request: runToPB(run)})
	if err != nil {
		return nil, fromStatus("run task "+run.Task+" in "+plugin, err)
	}
	return receiveTaskEvents("run task "+run.Task+" in "+plugin, stream, events)
}
