package capability

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/taskhost/taskhost/capability/internal/pb"
)

// grpcPlugin adapts a Lifecycle value to go-plugin. On the host impl is nil
// and only GRPCClient is used.
type grpcPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	impl Lifecycle
}

func (p *grpcPlugin) GRPCServer(broker *plugin.GRPCBroker, s *grpc.Server) error {
	host := &hostRef{}
	pb.RegisterLifecycleServer(s, &lifecycleServer{impl: p.impl, broker: broker, host: host})
	if m, ok := p.impl.(MetricsProvider); ok {
		pb.RegisterMetricsProviderServer(s, &metricsServer{impl: m})
	}
	if h, ok := p.impl.(HTTPHandler); ok {
		pb.RegisterHTTPHandlerServer(s, &httpServer{impl: h})
	}
	if a, ok := p.impl.(ActionProvider); ok {
		pb.RegisterActionProviderServer(s, &actionServer{impl: a})
	}
	if t, ok := p.impl.(TaskProvider); ok {
		pb.RegisterTaskProviderServer(s, &taskServer{impl: t, host: host})
	}
	if t, ok := p.impl.(TaskSubmitter); ok {
		pb.RegisterTaskSubmitterServer(s, &submitServer{impl: t})
	}
	return nil
}

// hostRef holds the host's services the plugin got at its last Configure,
// for the contexts of its tasks (Submit).
type hostRef struct {
	mu sync.Mutex
	hs HostServices
}

func (r *hostRef) set(hs HostServices) {
	r.mu.Lock()
	r.hs = hs
	r.mu.Unlock()
}

func (r *hostRef) get() HostServices {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.hs
}

func (p *grpcPlugin) GRPCClient(ctx context.Context, broker *plugin.GRPCBroker, conn *grpc.ClientConn) (any, error) {
	return newClient(ctx, broker, conn), nil
}

type lifecycleServer struct {
	pb.UnimplementedLifecycleServer
	impl   Lifecycle
	broker *plugin.GRPCBroker
	host   *hostRef

	mu       sync.Mutex
	hostConn *grpc.ClientConn
}

func (s *lifecycleServer) Describe(ctx context.Context, _ *pb.DescribeRequest) (*pb.DescribeResponse, error) {
	d, err := s.impl.Describe(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	// The capability list is what the value really implements, whatever
	// the plugin says: the host relies on it.
	caps := CapabilitiesOf(s.impl)
	api := d.APIVersions
	if len(api) == 0 {
		api = []int{ProtocolVersion}
	}
	resp := &pb.DescribeResponse{Name: d.Name, Version: d.Version, Pid: int64(os.Getpid())}
	for _, v := range api {
		resp.ApiVersions = append(resp.ApiVersions, int32(v))
	}
	for _, c := range caps {
		resp.Capabilities = append(resp.Capabilities, string(c))
	}
	return resp, nil
}

func (s *lifecycleServer) Configure(ctx context.Context, req *pb.ConfigureRequest) (*pb.ConfigureResponse, error) {
	// Dial at once: go-plugin forgets unclaimed broker connection info
	// after five seconds.
	conn, err := s.broker.Dial(req.HostBrokerId)
	if err != nil {
		return nil, toStatus(err)
	}
	s.mu.Lock()
	if s.hostConn != nil {
		_ = s.hostConn.Close()
	}
	s.hostConn = conn
	s.mu.Unlock()
	cfg := req.ConfigJson
	if len(bytes.TrimSpace(cfg)) == 0 {
		cfg = []byte("{}")
	}
	hs := &hostServicesClient{c: pb.NewHostServicesClient(conn)}
	s.host.set(hs)
	err = s.impl.Configure(ctx, ConfigureRequest{
		Config:      json.RawMessage(cfg),
		Host:        hs,
		HostVersion: req.HostVersion,
		LogLevel:    req.LogLevel,
	})
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.ConfigureResponse{}, nil
}

func (s *lifecycleServer) CheckHealth(ctx context.Context, _ *pb.CheckHealthRequest) (*pb.CheckHealthResponse, error) {
	h, err := s.impl.CheckHealth(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.CheckHealthResponse{Status: pb.CheckHealthResponse_Status(h.Status), Message: h.Message}, nil
}

func (s *lifecycleServer) Stop(ctx context.Context, _ *pb.StopRequest) (*pb.StopResponse, error) {
	if err := s.impl.Stop(ctx); err != nil {
		return nil, toStatus(err)
	}
	return &pb.StopResponse{}, nil
}

type metricsServer struct {
	pb.UnimplementedMetricsProviderServer
	impl MetricsProvider
}

func (s *metricsServer) CollectMetrics(ctx context.Context, _ *pb.CollectMetricsRequest) (*pb.CollectMetricsResponse, error) {
	m, err := s.impl.CollectMetrics(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.CollectMetricsResponse{Payload: m.Body, Format: m.Format}, nil
}

type actionServer struct {
	pb.UnimplementedActionProviderServer
	impl ActionProvider
}

func (s *actionServer) ListActions(ctx context.Context, _ *pb.ListActionsRequest) (*pb.ListActionsResponse, error) {
	specs, err := s.impl.ListActions(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &pb.ListActionsResponse{}
	for _, a := range specs {
		resp.Actions = append(resp.Actions, &pb.ActionSpec{
			Id: a.ID, Title: a.Title, Description: a.Description,
			Confirm: a.Confirm, Dangerous: a.Dangerous, TimeoutSeconds: int32(a.TimeoutSeconds),
		})
	}
	return resp, nil
}

func (s *actionServer) InvokeAction(ctx context.Context, req *pb.InvokeActionRequest) (*pb.InvokeActionResponse, error) {
	res, err := s.impl.InvokeAction(ctx, ActionRequest{
		ActionID: req.ActionId, Params: req.ParamsJson, Actor: req.Actor, RequestID: req.RequestId,
	})
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.InvokeActionResponse{Message: res.Message, ResultJson: res.Result}, nil
}

type taskServer struct {
	pb.UnimplementedTaskProviderServer
	impl TaskProvider
	host *hostRef

	directMu sync.Mutex
	direct   *directListener // opened at the first OpenTaskListener
}

func (s *taskServer) ListTasks(ctx context.Context, _ *pb.ListTasksRequest) (*pb.ListTasksResponse, error) {
	specs, err := s.impl.ListTasks(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	return tasksToPB(specs), nil
}

func tasksToPB(specs []TaskSpec) *pb.ListTasksResponse {
	resp := &pb.ListTasksResponse{}
	for _, t := range specs {
		resp.Tasks = append(resp.Tasks, &pb.TaskSpec{
			Name: t.Name, Description: t.Description, Topic: t.Topic, MaxAttempts: int32(t.MaxAttempts),
			TimeoutSeconds: t.Timeout.Seconds(),
		})
	}
	return resp
}

func tasksFromPB(r *pb.ListTasksResponse) []TaskSpec {
	out := make([]TaskSpec, 0, len(r.Tasks))
	for _, t := range r.Tasks {
		out = append(out, TaskSpec{Name: t.Name, Description: t.Description, Topic: t.Topic, MaxAttempts: int(t.MaxAttempts),
			Timeout: secondsToDuration(t.TimeoutSeconds)})
	}
	return out
}

func (s *taskServer) RunTask(req *pb.RunTaskRequest, stream pb.TaskProvider_RunTaskServer) error {
	ev := &streamEvents{send: stream.Send}
	ctx := withTaskScope(stream.Context(), s.host.get(), req.MessageId)
	res, err := s.impl.RunTask(ctx, TaskRun{
		Task: req.Task, Payload: req.PayloadJson, MessageID: req.MessageId, Attempt: int(req.Attempt),
	}, ev)
	final := finalEvent(res, err)
	ev.mu.Lock()
	defer ev.mu.Unlock()
	return stream.Send(final)
}

// streamEvents forwards a task's log lines and progress over a stream.
type streamEvents struct {
	mu   sync.Mutex
	send func(*pb.RunTaskEvent) error
}

func (e *streamEvents) Log(line string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	_ = e.send(&pb.RunTaskEvent{LogLine: line})
}

func (e *streamEvents) Progress(f float64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	_ = e.send(&pb.RunTaskEvent{Progress: f, HasProgress: true})
}

// httpServer runs an ordinary http.Handler for each proxied request and
// streams the response back in chunks.
type httpServer struct {
	pb.UnimplementedHTTPHandlerServer
	impl HTTPHandler
}

func (s *httpServer) ServeHTTP(req *pb.HTTPRequest, stream pb.HTTPHandler_ServeHTTPServer) error {
	r, err := proxiedRequest(stream.Context(), req, bytes.NewReader(req.Body))
	if err != nil {
		return err
	}
	r.ContentLength = int64(len(req.Body))
	w := &chunkWriter{stream: stream, header: http.Header{}}
	s.impl.ServeHTTP(w, r)
	return w.finish()
}

// ServeHTTPStream runs the handler on a request whose body arrives in
// parts as the handler reads it; the response goes back as it is written,
// so the handler may answer while it still reads (full duplex). The body
// is read from the stream on demand: gRPC's flow control holds the host
// back while the handler is slow, and nothing is buffered beyond one part.
func (s *httpServer) ServeHTTPStream(stream pb.HTTPHandler_ServeHTTPStreamServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	if first.Head == nil {
		return toStatus(&InvalidArgumentError{Msg: "bad proxied request: the first part carries no head"})
	}
	body := &streamBody{recv: stream.Recv, buf: first.Body, end: first.End}
	r, err := proxiedRequest(stream.Context(), first.Head, body)
	if err != nil {
		return err
	}
	r.ContentLength = -1
	w := &chunkWriter{stream: stream, header: http.Header{}}
	s.impl.ServeHTTP(w, r)
	return w.finish()
}

// proxiedRequest builds the handler's request from a proxied head.
func proxiedRequest(ctx context.Context, req *pb.HTTPRequest, body io.Reader) (*http.Request, error) {
	path := req.Path
	if path == "" || path[0] != '/' {
		path = "/" + path
	}
	target := path
	if req.RawQuery != "" {
		target += "?" + req.RawQuery
	}
	r, err := http.NewRequestWithContext(ctx, req.Method, target, body)
	if err != nil {
		return nil, toStatus(&InvalidArgumentError{Msg: "bad proxied request: " + err.Error()})
	}
	r.RequestURI = target
	r.RemoteAddr = req.RemoteAddr
	for _, h := range req.Headers {
		for _, v := range h.Values {
			r.Header.Add(h.Name, v)
		}
	}
	if req.Actor != "" {
		r.Header.Set("X-Taskhost-Actor", req.Actor)
	}
	return r, nil
}

// streamBody is the body of a streamed request: it receives the next part
// only when the handler has read the previous one. The body ends cleanly
// only at the part marked end; a stream that closes or fails before it is
// a cut body, read as an error so that a handler never takes a cut upload
// for a whole one.
type streamBody struct {
	recv func() (*pb.HTTPRequestPart, error)
	buf  []byte
	end  bool
	err  error
}

func (b *streamBody) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for len(b.buf) == 0 {
		if b.err != nil {
			return 0, b.err
		}
		if b.end {
			return 0, io.EOF
		}
		part, err := b.recv()
		switch {
		case err == io.EOF:
			b.err = fmt.Errorf("request body cut short: the host closed it before its end: %w", io.ErrUnexpectedEOF)
		case err != nil:
			b.err = fmt.Errorf("request body cut short (the client went away or stopped sending): %v: %w",
				fromStatus("receive body", err), io.ErrUnexpectedEOF)
		default:
			b.buf, b.end = part.Body, part.End
		}
	}
	n := copy(p, b.buf)
	b.buf = b.buf[n:]
	return n, nil
}

// Close stops reading: later reads fail. The rest of the body, if any, is
// dropped when the handler returns and the call ends.
func (b *streamBody) Close() error {
	if b.err == nil && !(b.end && len(b.buf) == 0) {
		b.err = errors.New("read on a closed request body")
	}
	b.buf = nil
	return nil
}

// chunkWriter is an http.ResponseWriter that sends gRPC chunks: status and
// headers first, then the body in pieces of at most chunkSize.
type chunkWriter struct {
	stream      chunkSender
	header      http.Header
	status      int
	wroteHeader bool
	sentHeader  bool
	buf         []byte
	err         error
}

const chunkSize = 32 << 10

// chunkSender is the response side of either HTTP call.
type chunkSender interface {
	Send(*pb.HTTPResponseChunk) error
}

func (w *chunkWriter) Header() http.Header { return w.header }

func (w *chunkWriter) WriteHeader(code int) {
	if w.wroteHeader {
		return
	}
	w.wroteHeader = true
	w.status = code
}

func (w *chunkWriter) Write(p []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	w.buf = append(w.buf, p...)
	if len(w.buf) >= chunkSize {
		w.Flush()
	}
	return len(p), w.err
}

// Flush sends what is buffered, so server-sent events and long responses
// reach the client as they are written.
func (w *chunkWriter) Flush() {
	if w.err != nil {
		return
	}
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	chunk := &pb.HTTPResponseChunk{Body: w.buf}
	if !w.sentHeader {
		// Later header changes are ignored, as with net/http.
		w.sentHeader = true
		chunk.Status = int32(w.status)
		chunk.Headers = headersToPB(w.header)
	}
	w.err = w.stream.Send(chunk)
	w.buf = nil
}

func (w *chunkWriter) finish() error {
	if !w.sentHeader || len(w.buf) > 0 {
		w.Flush()
	}
	if w.err != nil && w.err != io.EOF {
		return w.err
	}
	return nil
}

func headersToPB(h http.Header) []*pb.Header {
	out := make([]*pb.Header, 0, len(h))
	for k, v := range h {
		out = append(out, &pb.Header{Name: k, Values: v})
	}
	return out
}

// secondsToDuration reads a number of seconds from the wire: NaN reads as
// negative, so that it is refused as a negative one is, and a number too
// large for a Duration as the largest.
func secondsToDuration(s float64) time.Duration {
	switch {
	case math.IsNaN(s):
		return -1
	case s >= float64(math.MaxInt64)/float64(time.Second):
		return math.MaxInt64
	case s <= float64(math.MinInt64)/float64(time.Second):
		return math.MinInt64
	}
	return time.Duration(s * float64(time.Second))
}
