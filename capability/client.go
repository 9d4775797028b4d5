package capability

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/taskhost/taskhost/capability/internal/pb"
)

// Client is the host's handle on one running plugin process. It is built
// by go-plugin's Dispense; use FromRPC.
type Client struct {
	exited  context.Context
	broker  *plugin.GRPCBroker
	life    pb.LifecycleClient
	metrics pb.MetricsProviderClient
	http    pb.HTTPHandlerClient
	actions pb.ActionProviderClient
	tasks   pb.TaskProviderClient
	submit  pb.TaskSubmitterClient
}

func newClient(ctx context.Context, broker *plugin.GRPCBroker, conn *grpc.ClientConn) *Client {
	return &Client{
		exited:  ctx,
		broker:  broker,
		life:    pb.NewLifecycleClient(conn),
		metrics: pb.NewMetricsProviderClient(conn),
		http:    pb.NewHTTPHandlerClient(conn),
		actions: pb.NewActionProviderClient(conn),
		tasks:   pb.NewTaskProviderClient(conn),
		submit:  pb.NewTaskSubmitterClient(conn),
	}
}

// FromRPC dispenses the taskhost client from a started go-plugin client.
func FromRPC(rpc plugin.ClientProtocol) (*Client, error) {
	raw, err := rpc.Dispense(pluginKey)
	if err != nil {
		return nil, fmt.Errorf("dispense plugin: %w", err)
	}
	c, ok := raw.(*Client)
	if !ok {
		return nil, fmt.Errorf("dispense plugin: unexpected type %T", raw)
	}
	return c, nil
}

// Exited is closed when the plugin process exits.
func (c *Client) Exited() <-chan struct{} { return c.exited.Done() }

// Describe asks the plugin who it is.
func (c *Client) Describe(ctx context.Context) (Description, error) {
	r, err := c.life.Describe(ctx, &pb.DescribeRequest{})
	if err != nil {
		return Description{}, fromStatus("describe", err)
	}
	d := Description{Name: r.Name, Version: r.Version, PID: int(r.Pid)}
	for _, v := range r.ApiVersions {
		d.APIVersions = append(d.APIVersions, int(v))
	}
	for _, s := range r.Capabilities {
		d.Capabilities = append(d.Capabilities, Capability(s))
	}
	return d, nil
}

// Configure serves host to the plugin over the go-plugin broker and hands
// the plugin its configuration. It is called once per process start.
func (c *Client) Configure(ctx context.Context, req ConfigureRequest) error {
	if req.Host == nil {
		return errors.New("configure: no host services")
	}
	id := c.broker.NextId()
	host := req.Host
	go c.broker.AcceptAndServe(id, func(opts []grpc.ServerOption) *grpc.Server {
		s := grpc.NewServer(append(opts, hostServerOptions()...)...)
		pb.RegisterHostServicesServer(s, &hostServicesServer{impl: host})
		return s
	})
	_, err := c.life.Configure(ctx, &pb.ConfigureRequest{
		HostBrokerId: id,
		ConfigJson:   req.Config,
		HostVersion:  req.HostVersion,
		LogLevel:     req.LogLevel,
	})
	return fromStatus("configure", err)
}

// CheckHealth polls the plugin's own health.
func (c *Client) CheckHealth(ctx context.Context) (Health, error) {
	r, err := c.life.CheckHealth(ctx, &pb.CheckHealthRequest{})
	if err != nil {
		return Health{}, fromStatus("check health", err)
	}
	return Health{Status: HealthStatus(r.Status), Message: r.Message}, nil
}

// Stop asks the plugin to drain; ctx carries the deadline.
func (c *Client) Stop(ctx context.Context) error {
	_, err := c.life.Stop(ctx, &pb.StopRequest{})
	return fromStatus("stop", err)
}

// CollectMetrics fetches the plugin's exposition.
func (c *Client) CollectMetrics(ctx context.Context) (MetricsPayload, error) {
	r, err := c.metrics.CollectMetrics(ctx, &pb.CollectMetricsRequest{})
	if err != nil {
		return MetricsPayload{}, fromStatus("collect metrics", err)
	}
	return MetricsPayload{Body: r.Payload, Format: r.Format}, nil
}

// ListActions lists the plugin's operator actions.
func (c *Client) ListActions(ctx context.Context) ([]ActionSpec, error) {
	r, err := c.actions.ListActions(ctx, &pb.ListActionsRequest{})
	if err != nil {
		return nil, fromStatus("list actions", err)
	}
	out := make([]ActionSpec, 0, len(r.Actions))
	for _, a := range r.Actions {
		out = append(out, ActionSpec{
			ID: a.Id, Title: a.Title, Description: a.Description,
			Confirm: a.Confirm, Dangerous: a.Dangerous, TimeoutSeconds: int(a.TimeoutSeconds),
		})
	}
	return out, nil
}

// InvokeAction runs one action.
func (c *Client) InvokeAction(ctx context.Context, req ActionRequest) (ActionResult, error) {
	r, err := c.actions.InvokeAction(ctx, &pb.InvokeActionRequest{
		ActionId: req.ActionID, ParamsJson: req.Params, Actor: req.Actor, RequestId: req.RequestID,
	})
	if err != nil {
		return ActionResult{}, fromStatus("invoke action "+req.ActionID, err)
	}
	return ActionResult{Message: r.Message, Result: r.ResultJson}, nil
}

// ListTasks lists the tasks the plugin provides.
func (c *Client) ListTasks(ctx context.Context) ([]TaskSpec, error) {
	r, err := c.tasks.ListTasks(ctx, &pb.ListTasksRequest{})
	if err != nil {
		return nil, fromStatus("list tasks", err)
	}
	return tasksFromPB(r), nil
}

// RunTask runs one task in the plugin, forwarding its log lines and
// progress to events. A task error is returned as a *TaskError, with the
// outcome the task asked for.
func (c *Client) RunTask(ctx context.Context, run TaskRun, events TaskEvents) (json.RawMessage, error) {
	stream, err := c.tasks.RunTask(ctx, runToPB(run))
	if err != nil {
		return nil, fromStatus("run task "+run.Task, err)
	}
	return receiveTaskEvents("run task "+run.Task, stream, events)
}

type taskEventStream interface {
	Recv() (*pb.RunTaskEvent, error)
}

func receiveTaskEvents(what string, stream taskEventStream, events TaskEvents) (json.RawMessage, error) {
	for {
		ev, err := stream.Recv()
		if err == io.EOF {
			return nil, fmt.Errorf("%s: stream ended without a result: %w", what, ErrUnavailable)
		}
		if err != nil {
			return nil, fromStatus(what, err)
		}
		switch {
		case ev.Done:
			if ev.Error != "" {
				return ev.ResultJson, taskErrorOf(ev)
			}
			return ev.ResultJson, nil
		case ev.HasProgress:
			if events != nil {
				events.Progress(ev.Progress)
			}
		case ev.LogLine != "":
			if events != nil {
				events.Log(ev.LogLine)
			}
		}
	}
}

func runToPB(run TaskRun) *pb.RunTaskRequest {
	return &pb.RunTaskRequest{Task: run.Task, PayloadJson: run.Payload, MessageId: run.MessageID, Attempt: int32(run.Attempt)}
}

// ProxyRequest is an HTTP request forwarded to a plugin. Path starts at
// the plugin's root ("/api/tasks").
type ProxyRequest struct {
	Method     string
	Path       string
	RawQuery   string
	Header     http.Header
	Body       []byte
	RemoteAddr string
	Actor      string
}

// ProxyHTTP sends req to the plugin's HTTP handler. onHeader is called once
// with the status and headers, then onBody for each piece of the body, as
// the plugin writes it.
func (c *Client) ProxyHTTP(ctx context.Context, req ProxyRequest, onHeader func(status int, h http.Header), onBody func([]byte) error) error {
	stream, err := c.http.ServeHTTP(ctx, &pb.HTTPRequest{
		Method: req.Method, Path: req.Path, RawQuery: req.RawQuery,
		Headers: headersToPB(req.Header), Body: req.Body,
		RemoteAddr: req.RemoteAddr, Actor: req.Actor,
	})
	if err != nil {
		return fromStatus("http", err)
	}
	return receiveResponse(stream, onHeader, onBody)
}

// bodyPieceSize is the most of a streamed request body one part carries.
const bodyPieceSize = 32 << 10

// RequestBodyError is returned by ProxyHTTPStream when reading the request
// body failed (the client went away, or a read deadline passed). The call
// to the plugin was cancelled, so its handler read the body as cut short.
type RequestBodyError struct{ Err error }

func (e *RequestBodyError) Error() string { return "read request body: " + e.Err.Error() }

func (e *RequestBodyError) Unwrap() error { return e.Err }

// errAnswered stops the body sender once the plugin's answer has ended.
var errAnswered = errors.New("the plugin's answer ended")

// ProxyHTTPStream is ProxyHTTP for a request whose body is read from body
// as it arrives and sent in parts of up to 32 KiB while the answer comes
// back (full duplex); req.Body is ignored. Call it only on a plugin whose
// Description lists HTTPBodyStream: an older plugin answers
// ErrUnimplemented.
//
// A body read that fails cancels the call, so the plugin's handler reads
// its body as cut short; the error returned is then a *RequestBodyError.
// When the plugin answers before reading the whole body, body is closed
// (if it is an io.Closer) to end a read in progress. ProxyHTTPStream
// returns only once it reads body no more. ctx should not end because a
// body read failed: the body's error is reported when it ends the call.
func (c *Client) ProxyHTTPStream(ctx context.Context, req ProxyRequest, body io.Reader, onHeader func(status int, h http.Header), onBody func([]byte) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stream, err := c.http.ServeHTTPStream(ctx)
	if err != nil {
		return fromStatus("http", err)
	}
	head := &pb.HTTPRequestPart{Head: &pb.HTTPRequest{
		Method: req.Method, Path: req.Path, RawQuery: req.RawQuery,
		Headers: headersToPB(req.Header), RemoteAddr: req.RemoteAddr, Actor: req.Actor,
	}}
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		if err := sendBody(stream, head, body); err != nil {
			cancel(err)
		}
	}()
	err = receiveResponse(stream, onHeader, onBody)
	select {
	case <-sent:
	default:
		// The answer ended (or failed) first: stop sending.
		cancel(errAnswered)
		if cl, ok := body.(io.Closer); ok {
			_ = cl.Close()
		}
		<-sent
	}
	var bodyErr *RequestBodyError
	if errors.As(context.Cause(ctx), &bodyErr) {
		return bodyErr
	}
	return err
}

// sendBody sends head, then body in parts until its end, marked on the
// last part. A send that fails ends it quietly: the stream is over, and
// the receiving side reports why.
func sendBody(stream pb.HTTPHandler_ServeHTTPStreamClient, head *pb.HTTPRequestPart, body io.Reader) error {
	if stream.Send(head) != nil {
		return nil
	}
	for {
		// A fresh buffer each time: gRPC may still hold a sent message.
		// What one read gives is sent at once: a slow producer's lines
		// reach the plugin as they come.
		buf := make([]byte, bodyPieceSize)
		n, err := body.Read(buf)
		end := err == io.EOF
		if err != nil && !end {
			return &RequestBodyError{Err: err}
		}
		if n == 0 && !end {
			continue
		}
		if stream.Send(&pb.HTTPRequestPart{Body: buf[:n], End: end}) != nil {
			return nil
		}
		if end {
			_ = stream.CloseSend()
			return nil
		}
	}
}

// receiveResponse hands a plugin's answer, as it arrives, to onHeader
// (once) and onBody.
func receiveResponse(stream interface {
	Recv() (*pb.HTTPResponseChunk, error)
}, onHeader func(status int, h http.Header), onBody func([]byte) error) error {
	first := true
	for {
		chunk, err := stream.Recv()
		if err == io.EOF {
			if first {
				return fmt.Errorf("http: plugin sent no response: %w", ErrUnavailable)
			}
			return nil
		}
		if err != nil {
			return fromStatus("http", err)
		}
		if first {
			first = false
			h := http.Header{}
			for _, kv := range chunk.Headers {
				h[http.CanonicalHeaderKey(kv.Name)] = kv.Values
			}
			status := int(chunk.Status)
			if status == 0 {
				status = http.StatusOK
			}
			onHeader(status, h)
		}
		if len(chunk.Body) > 0 {
			if err := onBody(chunk.Body); err != nil {
				return err
			}
		}
	}
}
