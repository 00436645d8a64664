package cli

import (
	"context"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"chessd/client"
)

// The server and key: a flag, then the environment, then the config file, then the
// default server and no key.
func TestResolvePrecedence(t *testing.T) {
	home := t.TempDir()
	dir := filepath.Join(home, ".config", "chessd")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "client.json"), []byte(`{"server":"file.example:8080","key":"ce_test_file"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(t.TempDir(), "other.json")
	if err := os.WriteFile(other, []byte(`{"server":"https://other.example/v1","key":"ce_test_other"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		args   []string
		env    map[string]string
		server string
		key    string
		err    bool
	}{
		{"the file in ~/.config", nil, map[string]string{"HOME": home}, "http://file.example:8080/v1", "ce_test_file", false},
		{"the environment over the file", nil, map[string]string{"HOME": home, "CHESSD_SERVER": "http://env.example", "CHESSD_KEY": "ce_test_env"},
			"http://env.example/v1", "ce_test_env", false},
		{"flags over the environment", []string{"--server", "localhost:9000", "--key", "ce_test_flag"},
			map[string]string{"HOME": home, "CHESSD_SERVER": "http://env.example", "CHESSD_KEY": "ce_test_env"},
			"http://localhost:9000/v1", "ce_test_flag", false},
		{"CHESSD_CONFIG names the file", nil, map[string]string{"HOME": home, "CHESSD_CONFIG": other}, "https://other.example/v1", "ce_test_other", false},
		{"--config names the file", []string{"--config", other}, map[string]string{"HOME": home}, "https://other.example/v1", "ce_test_other", false},
		{"nothing: the default server, no key", nil, map[string]string{"HOME": t.TempDir()}, DefaultServer, "", false},
		{"a named file must exist", nil, map[string]string{"HOME": home, "CHESSD_CONFIG": filepath.Join(home, "missing.json")}, "", "", true},
	}
	for _, tt := range tests {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		c := connFlags(fs)
		if err := fs.Parse(tt.args); err != nil {
			t.Fatal(err)
		}
		server, key, err := c.resolve(func(k string) string { return tt.env[k] })
		if (err != nil) != tt.err || server != tt.server || key != tt.key {
			t.Errorf("%s: %q %q %v; want %q %q (error %v)", tt.name, server, key, err, tt.server, tt.key, tt.err)
		}
	}
}

func TestLine(t *testing.T) {
	tests := []struct {
		fen  string
		san  []string
		want string
	}{
		{"rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1", []string{"e4", "e5", "Nf3"}, "1. e4 e5 2. Nf3"},
		{"r1bqkbnr/pppp1ppp/2n5/1B2p3/4P3/5N2/PPPP1PPP/RNBQK2R b KQkq - 3 3", []string{"a6", "Ba4", "Nf6"}, "3... a6 4. Ba4 Nf6"},
		{"8/8/8/8/8/8/8/8 w - -", []string{"Kd2"}, "1. Kd2"},
	}
	for _, tt := range tests {
		if got := line(tt.fen, tt.san); got != tt.want {
			t.Errorf("line(%q, %v) = %q, want %q", tt.fen, tt.san, got, tt.want)
		}
	}
}

// analyze, usage and uci take flags only: an argument is refused before anything is
// asked of a server (none runs here), not ignored.
func TestFlagsOnlyCommandsRefuseArguments(t *testing.T) {
	for _, args := range [][]string{
		{"usage", "extra"},
		{"usage", "--from", "2026-01-01", "2026-01-31"},
		{"usage", "today", "--json"}, // --json after an argument is one too
		{"uci", "extra"},
		{"analyze", "--fen", "8/8/8/8/8/8/8/K6k w - - 0 1", "game.pgn"},
	} {
		// a server nothing listens on, should a command go on to ask it
		env := map[string]string{"CHESSD_SERVER": "http://127.0.0.1:1", "HOME": t.TempDir()}
		streams := IO{In: strings.NewReader(""), Out: io.Discard, Err: io.Discard, Getenv: func(k string) string { return env[k] }}
		err := Run(context.Background(), args, streams)
		if err == nil || !strings.Contains(err.Error(), "takes no arguments") {
			t.Errorf("chessd %s: %v, want it refused", strings.Join(args, " "), err)
		}
	}
}

// Every command talks through the client package's HTTPClient, whose keep-alive probes
// notice a dead server or network within seconds (client's TestDeadConnectionIsNoticed),
// not the generated client's default, whose probes take minutes.
func TestCommandsProbeTheirConnections(t *testing.T) {
	api, err := newAPI("http://localhost:8080/v1", "")
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := api.ClientInterface.(*client.Client); !ok || c.Client != client.HTTPClient() {
		t.Errorf("the commands' HTTP client is %#v, want client.HTTPClient()", api.ClientInterface)
	}
}
