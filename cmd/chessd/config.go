package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"chessd/engine"
	"chessd/executor"
	"chessd/ledger"
	"chessd/mail"
)

// config is everything the binary reads from its environment (README.md lists it).
type config struct {
	Port        int
	DatabaseURL string // empty: run the embedded cluster in DataDir
	DataDir     string
	PGPort      int // the embedded cluster's private port (its socket lives in DataDir)
	KeyPepper   []byte
	BaseURL     string
	LogLevel    slog.Level
	Engines     engine.Config
	// NoRateLimits turns rate limiting off (CHESSD_RATE_LIMITS=off), for load tests.
	NoRateLimits bool
	Executor     executor.Config
	Mail         mail.Config
	// InsecureWebhooks accepts http:// webhook URLs and delivers to private addresses
	// (development only).
	InsecureWebhooks bool
	// TrustedProxies are the load balancers whose X-Forwarded-For names the client
	// (CHESSD_TRUSTED_PROXIES: addresses or CIDR prefixes, comma-separated).
	TrustedProxies []netip.Prefix
	NoExecutor     bool
	Meter          ledger.MeterConfig
	// MetricsAddr is the metrics' own listener (CHESSD_METRICS_ADDR); empty: /metrics on
	// the API's listener (serve) or none (worker); "off": no metrics.
	MetricsAddr  string
	MetricsToken string // when set, a scrape must carry it as a bearer token
	// SchemaCheck is how often a job executor, and serve's mail and webhook senders and
	// budget alerts, check that no newer chessd migrated the database
	// (CHESSD_SCHEMA_CHECK); they stop when one has.
	SchemaCheck time.Duration
}

// maxParallel caps CHESSD_ENGINE_POOL_SIZE (engine processes per pool) and
// CHESSD_WORKER_JOBS (positions an executor searches at once, each on a process).
const maxParallel = 64

func loadConfig(getenv func(string) string) (config, error) {
	c := config{
		DatabaseURL: getenv("DATABASE_URL"),
		DataDir:     or(getenv("CHESSD_DATA_DIR"), ".data"),
		SchemaCheck: 10 * time.Second,
	}
	var err error
	if c.Port, err = portEnv(getenv, "PORT", 8080); err != nil {
		return c, err
	}
	if c.PGPort, err = portEnv(getenv, "CHESSD_PG_PORT", 54329); err != nil {
		return c, err
	}
	c.BaseURL = or(getenv("CHESSD_BASE_URL"), fmt.Sprintf("http://localhost:%d/v1", c.Port))
	if u, err := url.Parse(c.BaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		// it is the prefix of problem type URIs and of the verification mail's link
		return c, fmt.Errorf("CHESSD_BASE_URL must be an absolute http(s) URL such as https://api.example.com/v1, got %q", c.BaseURL)
	}
	if err := c.LogLevel.UnmarshalText([]byte(or(getenv("LOG_LEVEL"), "info"))); err != nil {
		return c, fmt.Errorf("LOG_LEVEL: %w", err)
	}
	c.Engines = engine.Config{Dir: or(getenv("CHESSD_ENGINES_DIR"), engine.DefaultDir())}
	for _, d := range []struct {
		name string
		dst  *time.Duration
	}{
		{"CHESSD_ENGINE_QUEUE_WAIT", &c.Engines.QueueWait},
		{"CHESSD_ENGINE_HANG_TIMEOUT", &c.Engines.HangTimeout},
		{"CHESSD_ENGINE_STOP_GRACE", &c.Engines.StopGrace},
		{"CHESSD_ENGINE_START_TIMEOUT", &c.Engines.StartTimeout},
		{"CHESSD_LEASE_TTL", &c.Meter.LeaseTTL},
		{"CHESSD_MAX_SETTLE_BACKLOG", &c.Meter.MaxBacklog},
		{"CHESSD_STOP_GRACE", &c.Meter.StopGrace},
		{"CHESSD_JOB_LEASE", &c.Executor.Lease},
		{"CHESSD_JOB_RECORD_EVERY", &c.Executor.RecordEvery},
		{"CHESSD_SCHEMA_CHECK", &c.SchemaCheck},
	} {
		if v := getenv(d.name); v != "" {
			// every one of them is a wait or a period: zero or less would stop a ticker
			// with a panic or a wait before it began
			if *d.dst, err = time.ParseDuration(v); err != nil || *d.dst <= 0 {
				return c, fmt.Errorf("%s must be a positive duration such as 10s, got %q", d.name, v)
			}
		}
	}
	for _, n := range []struct {
		name string
		dst  *int
	}{{"CHESSD_ENGINE_MAX_HASH_MB", &c.Engines.MaxHashMB}, {"CHESSD_ENGINE_MAX_THREADS", &c.Engines.MaxThreads}} {
		if v := getenv(n.name); v != "" {
			if *n.dst, err = strconv.Atoi(v); err != nil || *n.dst < 1 {
				return c, fmt.Errorf("%s must be a positive number, got %q", n.name, v)
			}
		}
	}
	if c.Engines.Eager, err = boolEnv(getenv, "CHESSD_ENGINE_EAGER"); err != nil {
		return c, err
	}
	if v := getenv("CHESSD_ENGINE_BOOST"); v != "" {
		// 0 would mean the default: -1 is none
		if c.Engines.Boost, err = strconv.Atoi(v); err != nil || c.Engines.Boost < -1 || c.Engines.Boost > 19 || c.Engines.Boost == 0 {
			return c, fmt.Errorf("CHESSD_ENGINE_BOOST must be -1 (none) or from 1 to 19, got %q", v)
		}
	}
	if v := getenv("CHESSD_ENGINE_POOL_SIZE"); v != "" {
		if c.Engines.PoolSize, err = strconv.Atoi(v); err != nil || c.Engines.PoolSize < 1 || c.Engines.PoolSize > maxParallel {
			return c, fmt.Errorf("CHESSD_ENGINE_POOL_SIZE must be from 1 to %d, got %q", maxParallel, v)
		}
	}
	c.Mail = mail.Config{SMTPAddr: getenv("CHESSD_SMTP_ADDR"), From: getenv("CHESSD_SMTP_FROM"),
		Username: getenv("CHESSD_SMTP_USERNAME"), Password: getenv("CHESSD_SMTP_PASSWORD")}
	if a := c.Mail.SMTPAddr; a != "" {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return c, fmt.Errorf("CHESSD_SMTP_ADDR must be host:port ([::1]:25 for an IPv6 address), got %q", a)
		}
	}
	if c.Mail.TLS, err = mail.ParseTLSMode(getenv("CHESSD_SMTP_TLS")); err != nil {
		return c, fmt.Errorf("CHESSD_SMTP_TLS: %w", err)
	}
	if c.InsecureWebhooks, err = boolEnv(getenv, "CHESSD_WEBHOOKS_INSECURE"); err != nil {
		return c, err
	}
	for _, v := range strings.Split(getenv("CHESSD_TRUSTED_PROXIES"), ",") {
		if v = strings.TrimSpace(v); v == "" {
			continue
		}
		p, err := netip.ParsePrefix(v)
		if a, aerr := netip.ParseAddr(v); err != nil && aerr == nil {
			p, err = a.Unmap().Prefix(a.Unmap().BitLen())
		}
		if err != nil {
			return c, fmt.Errorf("CHESSD_TRUSTED_PROXIES: %q is neither an address nor a prefix such as 10.0.0.0/8", v)
		}
		c.TrustedProxies = append(c.TrustedProxies, p.Masked())
	}
	c.MetricsAddr, c.MetricsToken = getenv("CHESSD_METRICS_ADDR"), getenv("CHESSD_METRICS_TOKEN")
	if a := c.MetricsAddr; a != "" && a != "off" {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return c, fmt.Errorf("CHESSD_METRICS_ADDR must be host:port, :port or off, got %q", a)
		}
	}
	c.Executor.Worker = getenv("CHESSD_WORKER_NAME")
	// an executor searches as many positions at once as the pool has processes
	c.Executor.Parallel = c.Engines.PoolSize
	if c.Executor.Parallel == 0 {
		c.Executor.Parallel = runtime.NumCPU()
	}
	if v := getenv("CHESSD_WORKER_JOBS"); v != "" {
		// the executor starts a searcher and sizes its queues by it: unbounded, a typo
		// ends in an out-of-memory crash. The pool's cap: a search at once per engine.
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > maxParallel {
			return c, fmt.Errorf("CHESSD_WORKER_JOBS must be from 0 to %d, got %q", maxParallel, v)
		}
		if n > 0 {
			c.Executor.Parallel = n
		}
		c.NoExecutor = n == 0 // serve without analysing jobs: workers do
	}
	switch v := getenv("CHESSD_RATE_LIMITS"); v {
	case "", "on":
	case "off":
		c.NoRateLimits = true
	default:
		return c, fmt.Errorf("CHESSD_RATE_LIMITS must be on or off, got %q", v)
	}
	if p := getenv("CHESSD_KEY_PEPPER"); p != "" {
		if len(p) < 16 {
			return c, errors.New("CHESSD_KEY_PEPPER must be at least 16 characters")
		}
		c.KeyPepper = []byte(p)
	}
	return c, nil
}

// pepper returns the configured pepper, or one generated once and kept in the data
// directory, so a development server's keys survive restarts. The file appears whole
// or not at all (written aside, synced, then linked into place), so a process starting
// beside the one that creates it never reads it half written, and one read back is
// held to the environment variable's rule.
func (c *config) pepper(logger *slog.Logger) ([]byte, error) {
	if c.KeyPepper != nil {
		return c.KeyPepper, nil
	}
	path := filepath.Join(c.DataDir, "key-pepper")
	read := func() ([]byte, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		if p := strings.TrimSpace(string(b)); len(p) >= 16 {
			return []byte(p), nil
		}
		return nil, fmt.Errorf("%s holds no usable pepper (at least 16 characters): delete it, or set CHESSD_KEY_PEPPER", path)
	}
	if p, err := read(); !errors.Is(err, fs.ErrNotExist) {
		return p, err
	}
	if err := os.MkdirAll(c.DataDir, 0o755); err != nil {
		return nil, err
	}
	buf := make([]byte, 32)
	if _, err := rand.Read(buf); err != nil {
		return nil, err
	}
	p := hex.EncodeToString(buf)
	tmp, err := os.CreateTemp(c.DataDir, ".key-pepper-*")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.WriteString(p + "\n")
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err := os.Link(tmp.Name(), path); errors.Is(err, fs.ErrExist) {
		return read() // another process put its own in place first
	} else if err != nil {
		return nil, err
	}
	logger.Warn("CHESSD_KEY_PEPPER not set: generated one in the data directory; set it in production", "path", path)
	return []byte(p), nil
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// boolEnv reads a boolean variable as strconv.ParseBool does (1, t, T, TRUE, true,
// True; 0, f, F, FALSE, false, False), unset being false. Anything else is an error:
// read as false, CHESSD_ENGINE_EAGER=yes would quietly be off.
func boolEnv(getenv func(string) string, name string) (bool, error) {
	v := getenv(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%s must be true or false (or 1, 0, t, f), got %q", name, v)
	}
	return b, nil
}

func portEnv(getenv func(string) string, name string, def int) (int, error) {
	v := getenv(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 || n > 65535 {
		return 0, fmt.Errorf("%s must be a port number, got %q", name, v)
	}
	return n, nil
}
