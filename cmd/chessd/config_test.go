package main

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"chessd/mail"
)

func TestLoadConfig(t *testing.T) {
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	c, err := loadConfig(env(nil))
	if err != nil || c.Port != 8080 || c.DataDir != ".data" || c.DatabaseURL != "" || c.BaseURL != "http://localhost:8080/v1" ||
		c.NoRateLimits || c.NoExecutor || c.Executor.Parallel < 1 || c.Mail.TLS != mail.TLSVerify {
		t.Fatalf("defaults: %+v %v", c, err)
	}
	c, err = loadConfig(env(map[string]string{"PORT": "9000", "CHESSD_ENGINE_POOL_SIZE": "3", "CHESSD_ENGINE_QUEUE_WAIT": "5s",
		"CHESSD_ENGINE_MAX_HASH_MB": "64", "CHESSD_ENGINE_BOOST": "-1", "CHESSD_RATE_LIMITS": "off", "CHESSD_WORKER_JOBS": "0", "LOG_LEVEL": "warn",
		"CHESSD_JOB_RECORD_EVERY": "400ms", "CHESSD_STOP_GRACE": "20s", "CHESSD_TRUSTED_PROXIES": "10.0.0.0/8, 192.0.2.1,2001:db8::/32",
		"CHESSD_KEY_PEPPER": "0123456789abcdef0123", "CHESSD_SMTP_ADDR": "[::1]:25", "CHESSD_SMTP_TLS": "skip-verify"}))
	if err != nil || c.Port != 9000 || c.Engines.PoolSize != 3 || c.Engines.QueueWait != 5*time.Second || c.Engines.MaxHashMB != 64 ||
		c.Engines.Boost != -1 || !c.NoRateLimits || !c.NoExecutor || c.Executor.Parallel != 3 || c.Executor.RecordEvery != 400*time.Millisecond || c.Meter.StopGrace != 20*time.Second || string(c.KeyPepper) != "0123456789abcdef0123" ||
		fmt.Sprint(c.TrustedProxies) != "[10.0.0.0/8 192.0.2.1/32 2001:db8::/32]" || c.Mail.SMTPAddr != "[::1]:25" || c.Mail.TLS != mail.TLSSkipVerify {
		t.Fatalf("set: %+v %v", c, err)
	}
	for name, kv := range map[string]map[string]string{
		"port":            {"PORT": "http"},
		"port range":      {"PORT": "70000"},
		"log level":       {"LOG_LEVEL": "loud"},
		"pepper":          {"CHESSD_KEY_PEPPER": "short"},
		"pool size":       {"CHESSD_ENGINE_POOL_SIZE": "0"},
		"duration":        {"CHESSD_ENGINE_HANG_TIMEOUT": "soon"},
		"record every":    {"CHESSD_JOB_RECORD_EVERY": "often"},
		"schema check":    {"CHESSD_SCHEMA_CHECK": "0"}, // a ticker of zero panics
		"proxies":         {"CHESSD_TRUSTED_PROXIES": "10.0.0.0/8,lb.internal"},
		"negative":        {"CHESSD_LEASE_TTL": "-15s"},
		"rate limits":     {"CHESSD_RATE_LIMITS": "maybe"},
		"worker jobs":     {"CHESSD_WORKER_JOBS": "-1"},
		"worker jobs cap": {"CHESSD_WORKER_JOBS": "65"}, // 9 queues' worth of slots each: 10⁹ ran out of memory
		"pool size cap":   {"CHESSD_ENGINE_POOL_SIZE": "65"},
		"hash":            {"CHESSD_ENGINE_MAX_HASH_MB": "0"},
		"boost 0":         {"CHESSD_ENGINE_BOOST": "0"},
		"boost range":     {"CHESSD_ENGINE_BOOST": "20"},
		"smtp tls":        {"CHESSD_SMTP_TLS": "insecure"},
		"smtp addr":       {"CHESSD_SMTP_ADDR": "mail.example.com"}, // no port
		"smtp ipv6":       {"CHESSD_SMTP_ADDR": "::1:25"},
		"eager yes":       {"CHESSD_ENGINE_EAGER": "yes"}, // was read as false
		"eager on":        {"CHESSD_ENGINE_EAGER": "on"},
		"insecure yes":    {"CHESSD_WEBHOOKS_INSECURE": "yes"},
		"base url path":   {"CHESSD_BASE_URL": "/v1"},
		"base url host":   {"CHESSD_BASE_URL": "api.example.com/v1"},
		"base url scheme": {"CHESSD_BASE_URL": "ftp://api.example.com/v1"},
		"base url empty":  {"CHESSD_BASE_URL": "https:///v1"},
	} {
		_, err := loadConfig(env(kv))
		for v := range kv {
			if err == nil || !strings.Contains(err.Error(), v) {
				t.Errorf("%s: %v gave %v, want an error naming %s", name, kv, err, v)
			}
		}
	}
	if c, err := loadConfig(env(map[string]string{"CHESSD_WORKER_JOBS": "64"})); err != nil || c.Executor.Parallel != 64 {
		t.Errorf("CHESSD_WORKER_JOBS=64: parallel %d, %v", c.Executor.Parallel, err)
	}
	// every boolean variable reads what strconv.ParseBool does
	for v, want := range map[string]bool{"": false, "1": true, "true": true, "TRUE": true, "t": true, "0": false, "false": false, "F": false} {
		c, err := loadConfig(env(map[string]string{"CHESSD_ENGINE_EAGER": v, "CHESSD_WEBHOOKS_INSECURE": v}))
		if err != nil || c.Engines.Eager != want || c.InsecureWebhooks != want {
			t.Errorf("%q: eager %t, insecure webhooks %t, %v; want %t", v, c.Engines.Eager, c.InsecureWebhooks, err, want)
		}
	}
	if c, err := loadConfig(env(map[string]string{"CHESSD_BASE_URL": "https://api.example.com/v1"})); err != nil || c.BaseURL != "https://api.example.com/v1" {
		t.Errorf("an https base URL: %q %v", c.BaseURL, err)
	}
}

// Without CHESSD_KEY_PEPPER, every process on one data directory gets the same
// generated pepper, however many start at once, and a file that holds no usable pepper
// is an error, never a pepper.
func TestGeneratedPepper(t *testing.T) {
	logger := slog.New(slog.DiscardHandler)
	c := config{DataDir: t.TempDir()}
	const starts = 8
	got := make([][]byte, starts)
	errs := make([]error, starts)
	var wg sync.WaitGroup
	for i := range starts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := c
			got[i], errs[i] = c.pepper(logger)
		}()
	}
	wg.Wait()
	for i := range starts {
		if errs[i] != nil || len(got[i]) != 64 || string(got[i]) != string(got[0]) {
			t.Fatalf("start %d: %q %v; start 0: %q", i, got[i], errs[i], got[0])
		}
	}
	path := filepath.Join(c.DataDir, "key-pepper")
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("pepper file: %v %v", fi.Mode(), err)
	}
	if again, err := c.pepper(logger); err != nil || string(again) != string(got[0]) {
		t.Fatalf("read again: %q %v", again, err)
	}
	for name, setup := range map[string]func(string) error{
		"empty":     func(p string) error { return os.WriteFile(p, nil, 0o600) },
		"short":     func(p string) error { return os.WriteFile(p, []byte("abc\n"), 0o600) },
		"directory": func(p string) error { return os.Mkdir(p, 0o700) },
	} {
		c := config{DataDir: t.TempDir()}
		if err := setup(filepath.Join(c.DataDir, "key-pepper")); err != nil {
			t.Fatal(err)
		}
		if p, err := c.pepper(logger); err == nil {
			t.Errorf("%s pepper file: got %q, want an error", name, p)
		}
	}
}
