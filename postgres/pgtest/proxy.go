package pgtest

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// Proxy is a TCP proxy between clients and the test server that reads enough of the
// PostgreSQL protocol to cut a connection at a chosen moment: a real network fault, for
// tests of what the service does when the database goes away mid-transaction or when a
// COMMIT's outcome is unknown. Connections are plain (sslmode=disable).
type Proxy struct {
	tb     testing.TB
	ln     net.Listener
	dial   func() (net.Conn, error)
	mu     sync.Mutex
	cut    *cutRule
	down   bool
	conns  map[*proxyConn]bool
	closed bool
}

// CutMode says where an armed proxy cuts a connection.
type CutMode int

const (
	// AfterCommit forwards the COMMIT (and the rest of its round trip) to the server,
	// waits until the server has answered all of it, and closes the connection without
	// passing the answer on: the transaction committed, and the client never learns it.
	AfterCommit CutMode = iota
	// BeforeCommit closes the connection instead of forwarding the COMMIT: the
	// transaction never commits, and the client learns nothing either.
	BeforeCommit
)

type cutRule struct {
	marker string
	mode   CutMode
	fired  chan struct{}
}

// NewProxy starts a proxy in front of the database at dbURL and returns it with the
// URL that connects through it. It stops when the test ends.
func NewProxy(tb testing.TB, dbURL string) (*Proxy, string) {
	tb.Helper()
	cfg, err := pgconn.ParseConfig(dbURL)
	if err != nil {
		tb.Fatal(err)
	}
	network, addr := "tcp", net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port))
	if strings.HasPrefix(cfg.Host, "/") {
		network, addr = "unix", fmt.Sprintf("%s/.s.PGSQL.%d", cfg.Host, cfg.Port)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &Proxy{tb: tb, ln: ln, dial: func() (net.Conn, error) { return net.Dial(network, addr) }, conns: map[*proxyConn]bool{}}
	go p.accept()
	tb.Cleanup(p.close)
	u := &url.URL{Scheme: "postgres", User: url.User(cfg.User), Host: ln.Addr().String(), Path: "/" + cfg.Database,
		RawQuery: "sslmode=disable"}
	return p, u.String()
}

// CutCommit arms the proxy once: the next COMMIT sent on a connection whose
// transaction ran a statement containing marker is cut as mode says. The channel is
// closed when it happened.
func (p *Proxy) CutCommit(marker string, mode CutMode) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = &cutRule{marker: marker, mode: mode, fired: make(chan struct{})}
	return p.cut.fired
}

// Down drops every connection and refuses new ones until Up: the database is away.
func (p *Proxy) Down() {
	p.mu.Lock()
	p.down = true
	conns := p.conns
	p.conns = map[*proxyConn]bool{}
	p.mu.Unlock()
	for c := range conns {
		c.close()
	}
}

// Silence makes every open connection half-open: from now on nothing passes either
// way and nothing is closed, as when a NAT or a firewall forgets a connection. New
// connections pass.
func (p *Proxy) Silence() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.silent.Store(true)
	}
}

// Up lets connections through again.
func (p *Proxy) Up() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}

func (p *Proxy) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.ln.Close()
	p.Down()
}

func (p *Proxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse := p.down || p.closed
		p.mu.Unlock()
		if refuse {
			client.Close()
			continue
		}
		server, err := p.dial()
		if err != nil {
			client.Close()
			continue
		}
		c := &proxyConn{p: p, client: client, server: server, stmts: map[string]string{}, serverDone: make(chan struct{})}
		p.mu.Lock()
		if p.down || p.closed {
			p.mu.Unlock()
			c.close()
			continue
		}
		p.conns[c] = true
		p.mu.Unlock()
		go c.fromClient()
		go c.fromServer()
	}
}

// proxyConn is one client connection and its server connection.
type proxyConn struct {
	p              *Proxy
	client, server net.Conn
	once           sync.Once
	stmts          map[string]string // prepared statement name -> SQL (client side only)
	marked         bool              // the transaction ran a statement with the marker
	mu             sync.Mutex
	cutting        *cutRule      // set once the COMMIT went out in AfterCommit mode
	serverDone     chan struct{} // closed when fromServer has ended
	silent         atomic.Bool   // half-open (Silence): messages are dropped both ways
}

func (c *proxyConn) close() {
	c.once.Do(func() {
		c.client.Close()
		c.server.Close()
		c.p.mu.Lock()
		delete(c.p.conns, c)
		c.p.mu.Unlock()
	})
}

// fromClient forwards the client's messages one by one, watching for the armed cut.
func (c *proxyConn) fromClient() {
	defer c.close()
	r := bufio.NewReader(c.client)
	// The startup message has no type byte.
	if err := forwardUntyped(r, c.server); err != nil {
		return
	}
	var afterCommit *cutRule // the COMMIT went out: forward up to its Sync, then stop
	for {
		typ, msg, err := readMessage(r)
		if err != nil {
			return
		}
		if afterCommit != nil {
			if _, err := c.server.Write(msg); err != nil {
				return
			}
			if typ == 'S' {
				<-c.serverDone // the server answers the whole round trip, unseen
				return
			}
			continue
		}
		sql := c.sqlOf(typ, msg)
		if rule := c.armedFor(sql); rule != nil {
			if rule.mode == BeforeCommit {
				close(rule.fired)
				return
			}
			c.mu.Lock()
			c.cutting = rule // from here on the server's answers are dropped
			c.mu.Unlock()
			afterCommit = rule
			if _, err := c.server.Write(msg); err != nil {
				return
			}
			if typ == 'Q' {
				<-c.serverDone
				return
			}
			continue
		}
		if c.silent.Load() {
			continue
		}
		if _, err := c.server.Write(msg); err != nil {
			return
		}
	}
}

// sqlOf is the SQL a Parse, Bind or simple Query message runs (Bind: the prepared
// statement's), or "" for other messages.
func (c *proxyConn) sqlOf(typ byte, msg []byte) string {
	body := msg[5:]
	switch typ {
	case 'Q':
		return cstring(body, 0)
	case 'P':
		name := cstring(body, 0)
		c.stmts[name] = cstring(body, len(name)+1)
		return "" // only prepared here; it runs at Bind
	case 'B':
		portal := cstring(body, 0)
		return c.stmts[cstring(body, len(portal)+1)]
	}
	return ""
}

// armedFor returns the armed rule when sql is the COMMIT it waits for.
func (c *proxyConn) armedFor(sql string) *cutRule {
	if sql == "" {
		return nil
	}
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	rule := c.p.cut
	if rule != nil && strings.Contains(sql, rule.marker) {
		c.marked = true
	}
	word := strings.ToUpper(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(sql), ";")))
	if word != "COMMIT" && word != "ROLLBACK" && word != "END" {
		return nil
	}
	marked := c.marked
	c.marked = false
	if rule == nil || !marked || word == "ROLLBACK" {
		return nil
	}
	c.p.cut = nil // once
	return rule
}

// fromServer forwards the server's messages, or drops them once a cut is under way
// and closes the connection when the server has answered the cut round trip.
func (c *proxyConn) fromServer() {
	defer close(c.serverDone)
	defer c.close()
	r := bufio.NewReader(c.server)
	for {
		typ, msg, err := readMessage(r)
		if err != nil {
			return
		}
		c.mu.Lock()
		rule := c.cutting
		c.mu.Unlock()
		if rule != nil {
			if typ == 'Z' { // ReadyForQuery: the COMMIT's round trip is over
				close(rule.fired)
				return
			}
			continue
		}
		if c.silent.Load() {
			continue
		}
		if _, err := c.client.Write(msg); err != nil {
			return
		}
	}
}

// readMessage reads one typed message (type byte, length, body) and returns it whole.
func readMessage(r *bufio.Reader) (byte, []byte, error) {
	head := make([]byte, 5)
	if _, err := io.ReadFull(r, head); err != nil {
		return 0, nil, err
	}
	n := int(binary.BigEndian.Uint32(head[1:]))
	if n < 4 {
		return 0, nil, errors.New("pgtest proxy: bad message length")
	}
	msg := make([]byte, 1+n)
	copy(msg, head)
	if _, err := io.ReadFull(r, msg[5:]); err != nil {
		return 0, nil, err
	}
	return head[0], msg, nil
}

// forwardUntyped forwards the startup message (length, then body).
func forwardUntyped(r *bufio.Reader, w io.Writer) error {
	head := make([]byte, 4)
	if _, err := io.ReadFull(r, head); err != nil {
		return err
	}
	n := int(binary.BigEndian.Uint32(head))
	if n < 8 {
		return errors.New("pgtest proxy: bad startup message")
	}
	msg := make([]byte, n)
	copy(msg, head)
	if _, err := io.ReadFull(r, msg[4:]); err != nil {
		return err
	}
	_, err := w.Write(msg)
	return err
}

func cstring(b []byte, from int) string {
	if from >= len(b) {
		return ""
	}
	if i := bytes.IndexByte(b[from:], 0); i >= 0 {
		return string(b[from : from+i])
	}
	return string(b[from:])
}
