// Command oldprovider is a task plugin as a binary built before the stream
// of attempts (TaskProvider.RunTasks) existed answers the host: its
// Describe lists lifecycle and tasks only, and it runs each attempt in a
// RunTask call of its own. The tests run it to check that such a plugin's
// tasks still run. Its one task, old.greet, greets {"name": "..."}.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/capability/internal/pb"
)

const name = "oldtasks"

type lifecycle struct {
	pb.UnimplementedLifecycleServer
}

func (lifecycle) Describe(context.Context, *pb.DescribeRequest) (*pb.DescribeResponse, error) {
	return &pb.DescribeResponse{Name: name, Version: "0.9.0", ApiVersions: []int32{1},
		Capabilities: []string{"lifecycle", "tasks"}, Pid: int64(os.Getpid())}, nil
}

func (lifecycle) Configure(context.Context, *pb.ConfigureRequest) (*pb.ConfigureResponse, error) {
	return &pb.ConfigureResponse{}, nil
}

func (lifecycle) CheckHealth(context.Context, *pb.CheckHealthRequest) (*pb.CheckHealthResponse, error) {
	return &pb.CheckHealthResponse{Status: pb.CheckHealthResponse_STATUS_OK}, nil
}

func (lifecycle) Stop(context.Context, *pb.StopRequest) (*pb.StopResponse, error) {
	return &pb.StopResponse{}, nil
}

// tasks serves ListTasks and RunTask; RunTasks, unknown to it, answers
// Unimplemented as such a binary's server does.
type tasks struct {
	pb.UnimplementedTaskProviderServer
}

func (tasks) ListTasks(context.Context, *pb.ListTasksRequest) (*pb.ListTasksResponse, error) {
	return &pb.ListTasksResponse{Tasks: []*pb.TaskSpec{{Name: "old.greet", Description: "greets, one call per attempt", MaxAttempts: 3}}}, nil
}

func (tasks) RunTask(req *pb.RunTaskRequest, stream pb.TaskProvider_RunTaskServer) error {
	var p struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal(req.PayloadJson, &p); err != nil || p.Name == "" {
		return stream.Send(&pb.RunTaskEvent{Done: true, Error: `the payload must be {"name": "..."}`, Outcome: pb.TaskOutcome_OUTCOME_PERMANENT})
	}
	if err := stream.Send(&pb.RunTaskEvent{LogLine: "greeting " + p.Name + " the old way"}); err != nil {
		return err
	}
	return stream.Send(&pb.RunTaskEvent{Done: true, ResultJson: fmt.Appendf(nil, `{"greeting":"hello, %s"}`, p.Name)})
}

type set struct{ plugin.NetRPCUnsupportedPlugin }

func (set) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	pb.RegisterLifecycleServer(s, lifecycle{})
	pb.RegisterTaskProviderServer(s, tasks{})
	return nil
}

func (set) GRPCClient(context.Context, *plugin.GRPCBroker, *grpc.ClientConn) (any, error) {
	return nil, fmt.Errorf("a plugin has no client")
}

func main() {
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig:  capability.Handshake,
		VersionedPlugins: map[int]plugin.PluginSet{capability.ProtocolVersion: {"taskhost": set{}}},
		GRPCServer:       plugin.DefaultGRPCServer,
		Logger:           capability.NewLogger(name),
	})
}
