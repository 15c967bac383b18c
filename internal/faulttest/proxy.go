package faulttest

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// proxy forwards TCP from the api replicas to Redis, and cuts them apart on demand:
//
//   - cut: every open connection is closed at once and new ones are closed as soon as
//     they are accepted, until heal (a partition: commands in flight may or may not
//     have run, their replies are lost);
//   - drop: the connections open now keep carrying commands to Redis, which runs
//     them, but Redis's replies are swallowed until heal closes those connections (a
//     network that loses replies: the caller's timeout fires on a command that ran).
type proxy struct {
	ln     net.Listener
	target string

	refuse atomic.Bool
	mu     sync.Mutex
	conns  map[*proxyConn]struct{}
	closed bool
	wg     sync.WaitGroup
}

type proxyConn struct {
	client, server net.Conn
	drop           atomic.Bool
}

func (c *proxyConn) close() {
	_ = c.client.Close()
	_ = c.server.Close()
}

func newProxy(listen, target string) (*proxy, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, target: target, conns: map[*proxyConn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.refuse.Load() {
			_ = c.Close()
			continue
		}
		s, err := net.DialTimeout("tcp", p.target, time.Second)
		if err != nil {
			_ = c.Close()
			continue
		}
		pc := &proxyConn{client: c, server: s}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			pc.close()
			return
		}
		p.conns[pc] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			_, _ = io.Copy(s, c)
			pc.close()
		}()
		go func() {
			defer p.wg.Done()
			buf := make([]byte, 32<<10)
			for {
				n, err := s.Read(buf)
				if n > 0 && !pc.drop.Load() {
					if _, werr := c.Write(buf[:n]); werr != nil {
						break
					}
				}
				if err != nil {
					break
				}
			}
			pc.close()
			p.mu.Lock()
			delete(p.conns, pc)
			p.mu.Unlock()
		}()
	}
}

// cut closes every connection and refuses new ones until heal.
func (p *proxy) cut() {
	p.refuse.Store(true)
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.close()
	}
}

// drop swallows the replies on the connections open now, until heal.
func (p *proxy) drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.drop.Store(true)
	}
}

// heal accepts connections again and closes those whose replies were dropped.
func (p *proxy) heal() {
	p.refuse.Store(false)
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		if c.drop.Load() {
			c.close()
		}
	}
}

// close stops the proxy and waits for its goroutines.
func (p *proxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
