package capability

import (
	"context"
	"crypto/tls"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/taskhost/taskhost/capability/internal/pb"
)

// StopDirectListeners stops the process's listeners of attempts, as the
// death of the provider process they stand for does.
var StopDirectListeners = stopDirectListeners

// LegacyPluginSet serves impl (an HTTPHandler) as a plugin binary built
// before ServeHTTPStream existed does: its Describe lists no
// HTTPBodyStream, and the streaming call is unknown to it.
func LegacyPluginSet(impl Lifecycle) plugin.PluginSet {
	return plugin.PluginSet{pluginKey: &legacyPlugin{impl: impl}}
}

type legacyPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	impl Lifecycle
}

func (p *legacyPlugin) GRPCServer(broker *plugin.GRPCBroker, s *grpc.Server) error {
	pb.RegisterLifecycleServer(s, &legacyLifecycle{lifecycleServer: &lifecycleServer{impl: p.impl, broker: broker}})
	pb.RegisterHTTPHandlerServer(s, &legacyHTTP{httpServer: &httpServer{impl: p.impl.(HTTPHandler)}})
	return nil
}

func (p *legacyPlugin) GRPCClient(ctx context.Context, broker *plugin.GRPCBroker, conn *grpc.ClientConn) (any, error) {
	return newClient(ctx, broker, conn), nil
}

type legacyLifecycle struct{ *lifecycleServer }

func (l *legacyLifecycle) Describe(ctx context.Context, req *pb.DescribeRequest) (*pb.DescribeResponse, error) {
	resp, err := l.lifecycleServer.Describe(ctx, req)
	if err == nil {
		resp.Capabilities = slices.DeleteFunc(resp.Capabilities, func(c string) bool { return c == string(HTTPBodyStream) })
	}
	return resp, err
}

type legacyHTTP struct{ *httpServer }

func (*legacyHTTP) ServeHTTPStream(pb.HTTPHandler_ServeHTTPStreamServer) error {
	return status.Error(codes.Unimplemented, "unknown method ServeHTTPStream for service taskhost.plugin.v1.HTTPHandler")
}

// TaskErrorOfWire decodes a final RunTaskEvent from its wire bytes and
// reads the TaskError it stands for, as a host reads a plugin's.
func TaskErrorOfWire(b []byte) (*TaskError, error) {
	var ev pb.RunTaskEvent
	if err := proto.Unmarshal(b, &ev); err != nil {
		return nil, err
	}
	return taskErrorOf(&ev), nil
}

// DirectCapacity dials a provider's listener of attempts l presenting cert,
// opens RunTasks and returns the capacity of the provider's first frame.
func DirectCapacity(ctx context.Context, l TaskListener, cert tls.Certificate) (uint32, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := dialDirect(ctx, l, cert)
	if err != nil {
		return 0, err
	}
	f, err := s.Recv()
	if err != nil {
		return 0, err
	}
	return f.Capacity, nil
}

// SelfSignedCert is the key pair and certificate one side of a direct
// connection makes.
var SelfSignedCert = selfSignedCert

// DirectSendRaw dials l presenting cert, writes raw on the connection
// as it is (then, with closeWrite, ends its side), and reads until the
// provider closes it: nil when it did, after its first frame (its
// capacity).
func DirectSendRaw(ctx context.Context, l TaskListener, cert tls.Certificate, raw []byte, closeWrite bool) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s, err := dialDirect(ctx, l, cert)
	if err != nil {
		return err
	}
	d := s.(directStream)
	if _, err := d.Recv(); err != nil {
		return fmt.Errorf("no first frame: %w", err)
	}
	if _, err := d.f.c.Write(raw); err != nil {
		return err
	}
	if closeWrite {
		if err := d.f.c.(*tls.Conn).CloseWrite(); err != nil {
			return err
		}
	}
	for {
		if _, err := d.Recv(); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("the provider kept the connection open: %w", ctx.Err())
			}
			return nil
		}
	}
}
