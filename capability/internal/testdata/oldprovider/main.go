// Command oldprovider is a task plugin that speaks the wire protocol by
// hand, for the tests. Installed as fp-plugin-oldtasks, it answers as a
// binary built before the stream of attempts (TaskProvider.RunTasks)
// existed does: its Describe lists lifecycle and tasks only, and it runs
// each attempt in a RunTask call of its own; its one task, old.greet,
// greets {"name": "..."}. Installed as fp-plugin-liar, it serves the
// stream but breaks its rules: for each attempt of liar.twice it sends an
// event for an attempt it was never given, an empty event, then the
// attempt's final event twice (result 1, then 2); for liar.flood, 100,000
// log lines of 1 KiB before the final event.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/capability/internal/pb"
)

// name is the plugin's name: oldtasks, or liar (from the binary's name).
var name = "oldtasks"

type lifecycle struct {
	pb.UnimplementedLifecycleServer
}

func (lifecycle) Describe(context.Context, *pb.DescribeRequest) (*pb.DescribeResponse, error) {
	caps := []string{"lifecycle", "tasks"}
	if name == "liar" {
		caps = append(caps, "tasks_stream")
	}
	return &pb.DescribeResponse{Name: name, Version: "0.9.0", ApiVersions: []int32{1},
		Capabilities: caps, Pid: int64(os.Getpid())}, nil
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
	if name == "liar" {
		return &pb.ListTasksResponse{Tasks: []*pb.TaskSpec{
			{Name: "liar.twice", Description: "ends twice, and speaks of attempts it never had", MaxAttempts: 1},
			{Name: "liar.flood", Description: "logs 100,000 lines of 1 KiB", MaxAttempts: 1},
		}}, nil
	}
	return &pb.ListTasksResponse{Tasks: []*pb.TaskSpec{{Name: "old.greet", Description: "greets, one call per attempt", MaxAttempts: 3}}}, nil
}

// RunTasks serves the liar's stream; the old binary does not know it.
func (t tasks) RunTasks(stream pb.TaskProvider_RunTasksServer) error {
	if name != "liar" {
		return t.UnimplementedTaskProviderServer.RunTasks(stream)
	}
	if err := stream.Send(&pb.TaskReturn{Capacity: 8}); err != nil {
		return err
	}
	for {
		d, err := stream.Recv()
		if err != nil {
			return nil
		}
		for _, a := range d.Attempts {
			var frames []*pb.TaskReturn
			switch a.Task {
			case "liar.twice":
				frames = append(frames, &pb.TaskReturn{Events: []*pb.TaskAttemptEvent{
					{Id: a.Id + 1_000_000, Event: &pb.RunTaskEvent{Done: true, ResultJson: []byte(`"never given"`)}},
					{Id: a.Id},
					{Id: a.Id, Event: &pb.RunTaskEvent{Done: true, ResultJson: []byte(`1`)}},
					{Id: a.Id, Event: &pb.RunTaskEvent{Done: true, ResultJson: []byte(`2`)}},
				}})
			case "liar.flood":
				line := strings.Repeat("x", 1024)
				for range 100 {
					f := &pb.TaskReturn{}
					for range 1000 {
						f.Events = append(f.Events, &pb.TaskAttemptEvent{Id: a.Id, Event: &pb.RunTaskEvent{LogLine: line}})
					}
					frames = append(frames, f)
				}
				frames = append(frames, &pb.TaskReturn{Events: []*pb.TaskAttemptEvent{{Id: a.Id, Event: &pb.RunTaskEvent{Done: true, ResultJson: []byte(`"flooded"`)}}}})
			default:
				frames = append(frames, &pb.TaskReturn{Events: []*pb.TaskAttemptEvent{{Id: a.Id, Event: &pb.RunTaskEvent{Done: true, Error: "no such task"}}}})
			}
			for _, f := range frames {
				if err := stream.Send(f); err != nil {
					return err
				}
			}
		}
	}
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
	if filepath.Base(os.Args[0]) == "fp-plugin-liar" {
		name = "liar"
	}
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig:  capability.Handshake,
		VersionedPlugins: map[int]plugin.PluginSet{capability.ProtocolVersion: {"taskhost": set{}}},
		GRPCServer:       plugin.DefaultGRPCServer,
		Logger:           capability.NewLogger(name),
	})
}
