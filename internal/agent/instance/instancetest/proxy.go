package instancetest

import (
	"io"
	"net"
	"sync"
	"time"
)

// cutProxy forwards TCP connections to the API server until cut: then it
// drops every connection and accepts none (a network partition).
type cutProxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  []net.Conn
}

func newCutProxy(t T, target string) *cutProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{l: l, target: target}
	t.Cleanup(func() { l.Close(); p.setCut(true) })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			if p.cut {
				p.mu.Unlock()
				conn.Close()
				continue
			}
			up, err := net.DialTimeout("tcp", target, 2*time.Second)
			if err != nil {
				p.mu.Unlock()
				conn.Close()
				continue
			}
			p.conns = append(p.conns, conn, up)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, conn); up.Close() }()
			go func() { _, _ = io.Copy(conn, up); conn.Close() }()
		}
	}()
	return p
}

func (p *cutProxy) addr() string { return p.l.Addr().String() }

func (p *cutProxy) setCut(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = on
	if on {
		for _, c := range p.conns {
			c.Close()
		}
		p.conns = nil
	}
}
