package capability

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"net"
	"runtime"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/taskhost/taskhost/capability/internal/pb"
)

// The direct connection of a stream of attempts: the host brokers it once,
// then frames go between the task system and the provider without the
// host. The caller (tasks_worker) makes a key pair and asks the host,
// over its own connection, to connect it to a provider
// (HostServices.ConnectTasks); the host asks the provider to allow that
// client certificate (TaskProvider.OpenTaskListener), and the provider
// answers where it listens and which certificate it presents. Each side
// accepts exactly the other's certificate, and only the host, which both
// trust, has handed them over: the trust anchors stay the host's.

// TaskListener is where a provider serves its stream of attempts
// directly (as frames: taskstream_frames.go).
type TaskListener struct {
	Network, Address string
	// ServerCert is the certificate the listener presents, DER.
	ServerCert []byte
}

// TaskConnector is implemented by a HostServices that connects the
// calling plugin to a provider directly (the host's).
type TaskConnector interface {
	// ConnectTasks has the named provider allow clientCert (DER) on its
	// own listener of attempts, and returns it: an error wrapping
	// ErrNotFound, ErrUnavailable or ErrUnimplemented (the provider does
	// not list TasksDirect) when it cannot.
	ConnectTasks(ctx context.Context, plugin string, clientCert []byte) (TaskListener, error)
}

// OpenTaskListener asks the plugin to serve its stream of attempts on a listener of its
// own to the client presenting clientCert (DER).
func (c *Client) OpenTaskListener(ctx context.Context, clientCert []byte) (TaskListener, error) {
	r, err := c.tasks.OpenTaskListener(ctx, &pb.OpenTaskListenerRequest{ClientCertDer: clientCert})
	if err != nil {
		return TaskListener{}, fromStatus("open a listener of attempts", err)
	}
	return TaskListener{Network: r.Network, Address: r.Address, ServerCert: r.ServerCertDer}, nil
}

func (s *hostServicesServer) ConnectTasks(ctx context.Context, req *pb.ConnectTasksRequest) (*pb.TaskListener, error) {
	c, ok := s.impl.(TaskConnector)
	if !ok {
		return nil, status.Error(codes.Unimplemented, "this host does not connect plugins directly")
	}
	l, err := c.ConnectTasks(ctx, req.Plugin, req.ClientCertDer)
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.TaskListener{Network: l.Network, Address: l.Address, ServerCertDer: l.ServerCert}, nil
}

func (h *hostServicesClient) connectTasks(ctx context.Context, plugin string, clientCert []byte) (TaskListener, error) {
	r, err := h.c.ConnectTasks(ctx, &pb.ConnectTasksRequest{Plugin: plugin, ClientCertDer: clientCert})
	if err != nil {
		return TaskListener{}, fromStatus("connect to plugin "+plugin, err)
	}
	return TaskListener{Network: r.Network, Address: r.Address, ServerCert: r.ServerCertDer}, nil
}

// taskConnector is a HostServices client that can ask the host for a
// direct connection: the gRPC client a plugin gets in Configure.
type taskConnector interface {
	connectTasks(ctx context.Context, plugin string, clientCert []byte) (TaskListener, error)
}

// connectDirect opens a stream of attempts straight to plugin, brokered
// by the host: ErrUnimplemented when the host or the plugin cannot (the
// stream then goes through the host, and does for legacyFor), or when the
// listener the plugin gave cannot be reached from here.
func (r *TaskRunner) connectDirect(ctx context.Context, plugin string) (dispatchStream, error) {
	c, ok := r.host.(taskConnector)
	if !ok {
		return nil, ErrUnimplemented
	}
	r.mu.Lock()
	if until, ok := r.relayed[plugin]; ok && time.Now().Before(until) {
		r.mu.Unlock()
		return nil, ErrUnimplemented
	}
	if r.cert == nil {
		cert, err := selfSignedCert()
		if err != nil {
			r.mu.Unlock()
			return nil, fmt.Errorf("make the certificate of direct streams: %w", err)
		}
		r.cert = &cert
	}
	cert := *r.cert
	r.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, capacityWait)
	l, err := c.connectTasks(cctx, plugin, cert.Certificate[0])
	cancel()
	if err == nil {
		var s dispatchStream
		if s, err = dialDirect(ctx, l, cert); err == nil {
			return s, nil
		}
		r.log.Warn("cannot reach a task plugin's listener of attempts; its attempts go through the host", "plugin", plugin, "address", l.Address, "error", err)
		err = fmt.Errorf("%w: %v", ErrUnimplemented, err)
	}
	if errors.Is(err, ErrUnimplemented) {
		r.mu.Lock()
		r.relayed[plugin] = time.Now().Add(legacyFor)
		r.mu.Unlock()
	}
	return nil, err
}

// maxAllowedClients bounds the client certificates a provider's listener
// accepts: each start of the task system makes a new one, and the newest
// are kept.
const maxAllowedClients = 8

// directListener is a provider's listener of attempts, opened at the
// first OpenTaskListener and kept for the life of the process. It is a
// Linux abstract socket: nothing in the file system to clean up, gone
// with the process however it ends; TLS, not the socket's permissions,
// decides who may connect.
type directListener struct {
	ln      net.Listener
	stopped bool // by stopDirectListeners
	addr    string
	cert    tls.Certificate
	mu      sync.Mutex
	allowed [][]byte // newest first
	conns   map[net.Conn]struct{}
}

// directListeners are the listeners of attempts this process opened.
var directListeners struct {
	sync.Mutex
	open []*directListener
}

// stopDirectListeners stops every listener of attempts of the process,
// breaking their streams, as the provider's end does. Tests that stand
// for a provider process in-process use it for that process's death.
func stopDirectListeners() {
	directListeners.Lock()
	open := directListeners.open
	directListeners.open = nil
	directListeners.Unlock()
	for _, l := range open {
		l.mu.Lock()
		l.stopped = true
		l.mu.Unlock()
		_ = l.ln.Close()
		l.closeConns()
	}
}

func (s *taskServer) OpenTaskListener(_ context.Context, req *pb.OpenTaskListenerRequest) (*pb.TaskListener, error) {
	if len(req.ClientCertDer) == 0 {
		return nil, status.Error(codes.InvalidArgument, "no client certificate")
	}
	if _, err := x509.ParseCertificate(req.ClientCertDer); err != nil {
		return nil, status.Error(codes.InvalidArgument, "the client certificate does not parse: "+err.Error())
	}
	if runtime.GOOS != "linux" {
		return nil, status.Error(codes.Unimplemented, "listeners of attempts are abstract sockets, which only Linux has")
	}
	l, err := s.listener()
	if err != nil {
		return nil, status.Error(codes.Unavailable, "open a listener of attempts: "+err.Error())
	}
	l.allow(req.ClientCertDer)
	return &pb.TaskListener{Network: "unix", Address: l.addr, ServerCertDer: l.cert.Certificate[0]}, nil
}

// listener returns the provider's listener of attempts, opening it at the
// first call.
func (s *taskServer) listener() (*directListener, error) {
	s.directMu.Lock()
	defer s.directMu.Unlock()
	if s.direct != nil && !s.direct.isStopped() {
		return s.direct, nil
	}
	cert, err := selfSignedCert()
	if err != nil {
		return nil, err
	}
	var name [12]byte
	if _, err := rand.Read(name[:]); err != nil {
		return nil, err
	}
	addr := "@taskhost-tasks-" + hex.EncodeToString(name[:])
	ln, err := net.Listen("unix", addr)
	if err != nil {
		return nil, err
	}
	l := &directListener{ln: ln, addr: addr, cert: cert}
	tc := &tls.Config{
		Certificates:          []tls.Certificate{cert},
		ClientAuth:            tls.RequireAnyClientCert,
		MinVersion:            tls.VersionTLS12,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error { return l.check(raw) },
	}
	go l.serve(tc, s)
	directListeners.Lock()
	directListeners.open = append(directListeners.open, l)
	directListeners.Unlock()
	s.direct = l
	return l, nil
}

func (l *directListener) isStopped() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stopped
}

func (l *directListener) allow(der []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, a := range l.allowed {
		if bytes.Equal(a, der) {
			return
		}
	}
	l.allowed = append([][]byte{der}, l.allowed...)
	if len(l.allowed) > maxAllowedClients {
		l.allowed = l.allowed[:maxAllowedClients]
	}
}

// check accepts a client presenting one of the allowed certificates.
func (l *directListener) check(raw [][]byte) error {
	if len(raw) == 0 {
		return errors.New("no client certificate")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, a := range l.allowed {
		if bytes.Equal(a, raw[0]) {
			return nil
		}
	}
	return errors.New("a client certificate the host did not hand over")
}

// serve accepts the connections of the listener, each a stream of
// attempts once its TLS handshake has checked the client's certificate.
func (l *directListener) serve(tc *tls.Config, s *taskServer) {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		if !l.track(c) {
			_ = c.Close()
			return
		}
		go func() {
			defer l.untrack(c)
			tlc := tls.Server(c, tc)
			ctx, cancel := context.WithTimeout(context.Background(), handshakeTimeout)
			err := tlc.HandshakeContext(ctx)
			cancel()
			if err != nil {
				_ = c.Close()
				return
			}
			s.serveFrames(tlc)
		}()
	}
}

// handshakeTimeout bounds a direct connection's TLS handshake.
const handshakeTimeout = 10 * time.Second

// track records an open connection, for stopDirectListeners; false once
// the listener is stopped.
func (l *directListener) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return false
	}
	if l.conns == nil {
		l.conns = map[net.Conn]struct{}{}
	}
	l.conns[c] = struct{}{}
	return true
}

func (l *directListener) untrack(c net.Conn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
}

func (l *directListener) closeConns() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.conns {
		_ = c.Close()
	}
}

// selfSignedCert makes a key pair and a certificate for one side of a
// direct connection. The other side compares it byte for byte, so its
// names and validity only need to satisfy TLS libraries.
func selfSignedCert() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "localhost", Organization: []string{"taskhost"}},
		DNSNames:     []string{"localhost"},
		NotBefore:    now.Add(-30 * time.Second),
		NotAfter:     now.Add(30 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// dialDirect dials a provider's listener of attempts, presenting cert and
// accepting exactly l's certificate. The connection closes when ctx ends.
func dialDirect(ctx context.Context, l TaskListener, cert tls.Certificate) (dispatchStream, error) {
	if l.Network != "unix" {
		return nil, fmt.Errorf("a listener of attempts on network %q (want unix)", l.Network)
	}
	want := l.ServerCert
	tc := &tls.Config{
		Certificates:       []tls.Certificate{cert},
		MinVersion:         tls.VersionTLS12,
		ServerName:         "localhost",
		InsecureSkipVerify: true, // replaced by the exact comparison below
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 || !bytes.Equal(raw[0], want) {
				return errors.New("the listener of attempts presents a certificate the host did not hand over")
			}
			return nil
		},
	}
	hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	defer cancel()
	d := tls.Dialer{Config: tc}
	c, err := d.DialContext(hctx, "unix", l.Address)
	if err != nil {
		return nil, err
	}
	go func() {
		<-ctx.Done()
		_ = c.Close()
	}()
	return directStream{f: newFrameConn(c)}, nil
}
