package capability

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/taskhost/taskhost/capability/internal/pb"
)

// A direct stream of attempts is not a gRPC call: after the TLS handshake
// each side writes its messages as frames, a 4-byte big-endian length and
// the message's protobuf bytes (TaskDispatch from the caller, TaskReturn
// from the provider), and the connection's end is the stream's end. Each
// side writes from one goroutine and reads from another, straight on the
// connection: a frame costs a write and a read, with none of HTTP/2's
// framing, flow-control windows and goroutine hand-offs. The socket's
// buffers are the flow control: a side that stops reading holds the
// other's writes back.

// frameConn reads and writes length-prefixed protobuf messages on c.
type frameConn struct {
	c  net.Conn
	r  *bufio.Reader
	w  *bufio.Writer
	wb []byte // the buffer of the message being written
	rb []byte // the buffer of the message being read
}

func newFrameConn(c net.Conn) *frameConn {
	return &frameConn{c: c, r: bufio.NewReaderSize(c, 64<<10), w: bufio.NewWriterSize(c, 64<<10)}
}

// write sends m as one frame; one goroutine at a time.
func (f *frameConn) write(m proto.Message) error {
	b, err := proto.MarshalOptions{}.MarshalAppend(f.wb[:0], m)
	if err != nil {
		return err
	}
	f.wb = b
	if len(b) > maxMessageBytes {
		return fmt.Errorf("a frame of %d bytes, more than %d", len(b), maxMessageBytes)
	}
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(b)))
	if _, err := f.w.Write(n[:]); err != nil {
		return err
	}
	if _, err := f.w.Write(b); err != nil {
		return err
	}
	return f.w.Flush()
}

// read receives the next frame into m; one goroutine at a time. The end
// of the connection between two frames is io.EOF.
func (f *frameConn) read(m proto.Message) error {
	var n [4]byte
	if _, err := io.ReadFull(f.r, n[:]); err != nil {
		return err
	}
	size := binary.BigEndian.Uint32(n[:])
	if size > maxMessageBytes {
		return fmt.Errorf("a frame of %d bytes, more than %d", size, maxMessageBytes)
	}
	if cap(f.rb) < int(size) {
		f.rb = make([]byte, size)
	}
	b := f.rb[:size]
	if _, err := io.ReadFull(f.r, b); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	return proto.Unmarshal(b, m)
}

// directStream is the caller's end of a direct stream of attempts. The
// frame that names the plugin, for a relay, has nothing to carry here.
type directStream struct{ f *frameConn }

func (d directStream) Send(h *pb.HostTaskDispatch) error {
	if h.Dispatch == nil {
		return nil
	}
	return d.f.write(h.Dispatch)
}

func (d directStream) Recv() (*pb.TaskReturn, error) {
	r := new(pb.TaskReturn)
	if err := d.f.read(r); err != nil {
		return nil, err
	}
	return r, nil
}

// frameServer is the provider's end of a direct stream of attempts; its
// context ends when the stream does.
type frameServer struct {
	f   *frameConn
	ctx context.Context
}

func (s frameServer) Context() context.Context { return s.ctx }

func (s frameServer) Recv() (*pb.TaskDispatch, error) {
	d := new(pb.TaskDispatch)
	if err := s.f.read(d); err != nil {
		return nil, err
	}
	return d, nil
}

func (s frameServer) Send(r *pb.TaskReturn) error { return s.f.write(r) }

// serveFrames runs the stream of attempts of one direct connection, then
// closes it.
func (s *taskServer) serveFrames(c net.Conn) {
	ctx, cancel := context.WithCancel(context.Background())
	var once sync.Once
	end := func() { once.Do(func() { cancel(); _ = c.Close() }) }
	defer end()
	_ = s.runTasks(frameServer{f: newFrameConn(c), ctx: ctx})
}
