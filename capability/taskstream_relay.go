package capability

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/taskhost/taskhost/capability/internal/pb"
)

// The host's part of RunTasks: it relays one stream of attempts from the
// calling plugin (tasks_worker) to the provider its first frame names,
// and the provider's frames back, one frame at a time. It keeps nothing of
// an attempt: the caller holds the attempts, and the flow control of each
// stream holds the other side back.

// TaskStreamRelay is implemented by a HostServices that relays streams of
// attempts to providers (the host's).
type TaskStreamRelay interface {
	// StreamProvider returns the client of the named plugin, which must
	// run and serve RunTasks (list TasksStream): else an error wrapping
	// ErrNotFound, ErrUnavailable or ErrUnimplemented.
	StreamProvider(ctx context.Context, plugin string) (*Client, error)
}

func (s *hostServicesServer) RunTasks(stream pb.HostServices_RunTasksServer) error {
	relay, ok := s.impl.(TaskStreamRelay)
	if !ok {
		return status.Error(codes.Unimplemented, "this host does not relay streams of attempts")
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	client, err := relay.StreamProvider(ctx, first.Plugin)
	if err != nil {
		return toStatus(err)
	}
	ps, err := client.tasks.RunTasks(ctx)
	if err != nil {
		return toStatus(fromStatus("open the stream of attempts of plugin "+first.Plugin, err))
	}
	if d := first.Dispatch; d != nil && (len(d.Attempts) > 0 || len(d.Cancels) > 0) {
		if err := ps.Send(d); err != nil {
			return relayError(first.Plugin, err)
		}
	}
	// Caller to provider, until the caller closes its side or fails.
	go func() {
		for {
			f, err := stream.Recv()
			if err != nil {
				if isEOF(err) {
					_ = ps.CloseSend()
				} else {
					cancel()
				}
				return
			}
			if f.Dispatch == nil {
				continue
			}
			if err := ps.Send(f.Dispatch); err != nil {
				cancel()
				return
			}
		}
	}()
	// Provider to caller, until the provider ends its side or fails.
	for {
		f, err := ps.Recv()
		if err != nil {
			if isEOF(err) {
				return nil
			}
			if ctx.Err() != nil && stream.Context().Err() != nil {
				return nil // the caller went away
			}
			return relayError(first.Plugin, err)
		}
		if err := stream.Send(f); err != nil {
			return err
		}
	}
}

// relayError is the status the caller gets when the provider's side of a
// relayed stream fails: the provider stopped or died, so its attempts in
// flight did not end here.
func relayError(plugin string, err error) error {
	if s, ok := status.FromError(err); ok && s.Code() == codes.Unimplemented {
		return status.Error(codes.Unimplemented, fmt.Sprintf("plugin %s does not serve streams of attempts", plugin))
	}
	return status.Error(codes.Unavailable, fmt.Sprintf("the stream of attempts of plugin %s broke: %v", plugin, fromStatus("relay", err)))
}
