package capability

import (
	"context"
	"encoding/json"
	"net"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/taskhost/taskhost/capability/internal/pb"
)

// noopProvider's every task returns at once.
type noopProvider struct{}

func (noopProvider) Describe(context.Context) (Description, error) {
	return Description{Name: "noop"}, nil
}
func (noopProvider) Configure(context.Context, ConfigureRequest) error { return nil }
func (noopProvider) CheckHealth(context.Context) (Health, error) {
	return Health{Status: HealthOK}, nil
}
func (noopProvider) Stop(context.Context) error                    { return nil }
func (noopProvider) ListTasks(context.Context) ([]TaskSpec, error) { return nil, nil }
func (noopProvider) RunTask(context.Context, TaskRun, TaskEvents) (json.RawMessage, error) {
	return nil, nil
}

// benchProvider serves noopProvider over go-plugin's test connection (a
// Unix socket) and returns the host's client of it.
func benchProvider(b *testing.B) *Client {
	client, server := plugin.TestPluginGRPCConn(b, false, PluginSet(noopProvider{}))
	b.Cleanup(func() { server.Stop(); _ = client.Close() })
	raw, err := client.Dispense(pluginKey)
	if err != nil {
		b.Fatal(err)
	}
	return raw.(*Client)
}

// relayHost is the host's side of the relay: HostServices served on a
// Unix socket, relaying streams to provider, and with direct, connecting
// the caller to the provider's own listener instead.
type relayHost struct {
	HostServices
	provider *Client
	direct   bool
}

func (h relayHost) StreamProvider(context.Context, string) (*Client, error) { return h.provider, nil }

func (h relayHost) ConnectTasks(ctx context.Context, _ string, clientCert []byte) (TaskListener, error) {
	if !h.direct {
		return TaskListener{}, ErrUnimplemented
	}
	return h.provider.OpenTaskListener(ctx, clientCert)
}

// benchHostServices serves the host's side to provider on a Unix socket
// and returns the plugin's client of it, as Configure gives it.
func benchHostServices(b testing.TB, provider *Client, direct bool) HostServices {
	sock := filepath.Join(b.TempDir(), "host.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer(hostServerOptions()...)
	pb.RegisterHostServicesServer(srv, &hostServicesServer{impl: relayHost{provider: provider, direct: direct}})
	go func() { _ = srv.Serve(ln) }()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close(); srv.Stop() })
	return &hostServicesClient{c: pb.NewHostServicesClient(conn)}
}

// runConcurrently runs b.N no-op attempts on runner from workers
// goroutines at once, as a pool of that many workers does.
func runConcurrently(b *testing.B, runner *TaskRunner, workers int) {
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	next := make(chan struct{}, workers)
	go func() {
		for range b.N {
			next <- struct{}{}
		}
		close(next)
	}()
	for range workers {
		wg.Go(func() {
			for range next {
				if _, err := runner.RunTask(context.Background(), "noop", TaskRun{Task: "t", MessageID: "1", Attempt: 1}, nil); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkRunTasks compares the host's relay (two hops) with the direct
// connection it brokers (one hop, with TLS), at 8 and 64 attempts at
// once.
func BenchmarkRunTasks(b *testing.B) {
	for _, workers := range []int{8, 64} {
		b.Run("relayed/workers="+itoa(workers), func(b *testing.B) {
			runner := NewTaskRunner(benchHostServices(b, benchProvider(b), false), TaskRunnerOptions{})
			defer runner.Close()
			runConcurrently(b, runner, workers)
		})
		b.Run("direct/workers="+itoa(workers), func(b *testing.B) {
			runner := NewTaskRunner(benchHostServices(b, benchProvider(b), true), TaskRunnerOptions{})
			defer runner.Close()
			runConcurrently(b, runner, workers)
		})
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// cancelProvider's task waits for its context, saying when it starts and
// when it sees the cancel.
type cancelProvider struct {
	noopProvider
	started, cancelled chan struct{}
}

func (p cancelProvider) RunTask(ctx context.Context, _ TaskRun, _ TaskEvents) (json.RawMessage, error) {
	p.started <- struct{}{}
	<-ctx.Done()
	p.cancelled <- struct{}{}
	return nil, context.Cause(ctx)
}

// BenchmarkCancelReachesTheProvider times a cancel from the caller's
// context ending to the provider's handler seeing its own end, through
// the host's relay and on a direct stream (reported as cancel-µs, the
// mean).
func BenchmarkCancelReachesTheProvider(b *testing.B) {
	for _, direct := range []bool{false, true} {
		name := "relayed"
		if direct {
			name = "direct"
		}
		b.Run(name, func(b *testing.B) { benchCancel(b, direct) })
	}
}

func benchCancel(b *testing.B, direct bool) {
	p := cancelProvider{started: make(chan struct{}), cancelled: make(chan struct{})}
	client, server := plugin.TestPluginGRPCConn(b, false, PluginSet(p))
	b.Cleanup(func() { server.Stop(); _ = client.Close() })
	raw, err := client.Dispense(pluginKey)
	if err != nil {
		b.Fatal(err)
	}
	runner := NewTaskRunner(benchHostServices(b, raw.(*Client), direct), TaskRunnerOptions{})
	defer runner.Close()
	var total time.Duration
	for b.Loop() {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			_, _ = runner.RunTask(ctx, "p", TaskRun{Task: "wait"}, nil)
			close(done)
		}()
		<-p.started
		t0 := time.Now()
		cancel()
		<-p.cancelled
		total += time.Since(t0)
		<-done
	}
	b.ReportMetric(float64(total.Microseconds())/float64(b.N), "cancel-µs")
}
