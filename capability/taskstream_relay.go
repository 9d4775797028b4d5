package capability

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/taskhost/taskhost/capability/internal/pb"
)

// The host's part of RunTasks: it relays one stream of attempts from the
// calling plugin (tasks_worker) to the provider its first frame names,
// and the provider's frames back, one frame at a time. It keeps nothing of
// an attempt, and decodes no attempt either: frames pass as bytes
// (rawFrame), the caller's with their envelope (HostTaskDispatch) taken
// off. The flow control of each stream holds the other side back.

// TaskStreamRelay is implemented by a HostServices that relays streams of
// attempts to providers (the host's).
type TaskStreamRelay interface {
	// StreamProvider returns the client of the named plugin, which must
	// run and serve RunTasks (list TasksStream): else an error wrapping
	// ErrNotFound, ErrUnavailable or ErrUnimplemented.
	StreamProvider(ctx context.Context, plugin string) (*Client, error)
}

// rawFrame is a message the relay passes on undecoded.
type rawFrame struct{ b []byte }

// relayCodec is the proto codec, except that a rawFrame goes on and off
// the wire as it is. The host's HostServices server and its RunTasks calls
// use it; every other message is encoded as usual.
type relayCodec struct{ proto encoding.CodecV2 }

var frameCodec = relayCodec{proto: encoding.GetCodecV2("proto")}

func (c relayCodec) Marshal(v any) (mem.BufferSlice, error) {
	if f, ok := v.(*rawFrame); ok {
		return mem.BufferSlice{mem.SliceBuffer(f.b)}, nil
	}
	return c.proto.Marshal(v)
}

func (c relayCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if f, ok := v.(*rawFrame); ok {
		f.b = data.Materialize()
		return nil
	}
	return c.proto.Unmarshal(data, v)
}

func (relayCodec) Name() string { return "proto" }

// hostServerOptions are the options of the server of HostServices a host
// serves each plugin.
func hostServerOptions() []grpc.ServerOption {
	return append(GRPCServerOptions(), grpc.ForceServerCodecV2(frameCodec))
}

// The fields of HostTaskDispatch, read off the wire by the relay.
const (
	dispatchPluginField   = 1
	dispatchDispatchField = 2
)

// openEnvelope reads a HostTaskDispatch's plugin and the bytes of its
// TaskDispatch (several occurrences concatenated, which is how protobuf
// merges them).
func openEnvelope(b []byte) (plugin string, dispatch []byte, err error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "", nil, protowire.ParseError(n)
		}
		b = b[n:]
		switch {
		case num == dispatchPluginField && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return "", nil, protowire.ParseError(m)
			}
			plugin, b = string(v), b[m:]
		case num == dispatchDispatchField && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return "", nil, protowire.ParseError(m)
			}
			dispatch, b = append(dispatch, v...), b[m:]
		default:
			m := protowire.ConsumeFieldValue(num, typ, b)
			if m < 0 {
				return "", nil, protowire.ParseError(m)
			}
			b = b[m:]
		}
	}
	return plugin, dispatch, nil
}

// relayStream is the server's end of HostServices.RunTasks, read and
// written as raw frames.
type relayStream interface {
	Context() context.Context
	RecvMsg(any) error
	SendMsg(any) error
}

// relayTasks relays one stream of attempts (HostServices.RunTasks).
func relayTasks(impl HostServices, stream relayStream) error {
	relay, ok := impl.(TaskStreamRelay)
	if !ok {
		return status.Error(codes.Unimplemented, "this host does not relay streams of attempts")
	}
	var first rawFrame
	if err := stream.RecvMsg(&first); err != nil {
		return err
	}
	plugin, dispatch, err := openEnvelope(first.b)
	if err != nil {
		return status.Error(codes.InvalidArgument, "a frame of the stream of attempts does not parse: "+err.Error())
	}
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	client, err := relay.StreamProvider(ctx, plugin)
	if err != nil {
		return toStatus(err)
	}
	ps, err := client.tasks.RunTasks(ctx, grpc.ForceCodecV2(frameCodec))
	if err != nil {
		return toStatus(fromStatus("open the stream of attempts of plugin "+plugin, err))
	}
	if len(dispatch) > 0 {
		if err := ps.SendMsg(&rawFrame{b: dispatch}); err != nil {
			return relayError(plugin, err)
		}
	}
	// Caller to provider, until the caller closes its side or fails.
	go func() {
		for {
			var f rawFrame
			err := stream.RecvMsg(&f)
			if err != nil {
				if isEOF(err) {
					_ = ps.CloseSend()
				} else {
					cancel()
				}
				return
			}
			_, d, err := openEnvelope(f.b)
			if err != nil {
				cancel()
				return
			}
			if len(d) == 0 {
				continue
			}
			if err := ps.SendMsg(&rawFrame{b: d}); err != nil {
				cancel()
				return
			}
		}
	}()
	// Provider to caller, until the provider ends its side or fails.
	for {
		var f rawFrame
		if err := ps.RecvMsg(&f); err != nil {
			if isEOF(err) {
				return nil
			}
			if stream.Context().Err() != nil {
				return nil // the caller went away
			}
			return relayError(plugin, err)
		}
		if err := stream.SendMsg(&f); err != nil {
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
	if errors.Is(err, context.Canceled) {
		return status.Error(codes.Canceled, "the stream of attempts was cancelled")
	}
	return status.Error(codes.Unavailable, fmt.Sprintf("the stream of attempts of plugin %s broke: %v", plugin, fromStatus("relay", err)))
}

func (s *hostServicesServer) RunTasks(stream pb.HostServices_RunTasksServer) error {
	return relayTasks(s.impl, stream)
}
