package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

// Every server-side command reads its command line before it opens anything: --help
// prints the command's own help and exits 0, and a flag it does not have, an argument
// too many or a missing one is refused with exit status 2; neither starts the embedded
// cluster (the data directory stays empty) nor anything else. PORT=0 is refused by the
// configuration, which is read only once the command line was: a command that read its
// configuration first, or went on past a bad command line, fails there, saying PORT.
func TestCommandLineIsReadFirst(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		says string // on stdout (help) or in the message (errors)
	}{
		{[]string{"serve", "--help"}, 0, "usage: chessd serve\n"},
		{[]string{"worker", "-h"}, 0, "usage: chessd worker\n"},
		{[]string{"migrate", "--help"}, 0, "usage: chessd migrate\n"},
		{[]string{"rebuild", "--help"}, 0, "usage: chessd rebuild\n"},
		{[]string{"verify", "-h"}, 0, "-anchors"},
		{[]string{"replay", "--help"}, 0, "-as-of"},
		{[]string{"audit", "--help"}, 0, "-key"},
		{[]string{"plan", "-h"}, 0, "-plan"},
		{[]string{"refund", "--help"}, 0, "-reason"},
		{[]string{"dispute", "--help"}, 0, "usage: chessd dispute list |"},
		{[]string{"dispute", "accept", "--help"}, 0, "-note"},
		{[]string{"setaside", "skip", "-h"}, 0, "-reason"},
		{[]string{"help"}, 0, "  setaside  "},
		{[]string{"serve", "--port", "9000"}, 2, "flag provided but not defined: -port"},
		{[]string{"worker", "now"}, 2, `takes no arguments, got "now"`},
		{[]string{"migrate", "--dry-run"}, 2, "-dry-run"},
		{[]string{"rebuild", "accounts"}, 2, `takes no arguments, got "accounts"`},
		{[]string{"verify", "extra"}, 2, `takes no arguments, got "extra"`},
		{[]string{"verify", "--anchor", "6:nothex"}, 2, "invalid value"},
		{[]string{"verify", "--anchors", "/nonexistent/anchors"}, 2, "/nonexistent/anchors"},
		{[]string{"replay", "all"}, 2, "takes no arguments"},
		{[]string{"replay", "--account", "acct_x"}, 2, "--account goes with --as-of"},
		{[]string{"replay", "--as-of", "2026-01-01T00:00:00Z"}, 2, "needs --account"},
		{[]string{"audit", "--key", "key_x"}, 2, "--key, --from and --to are required"},
		{[]string{"audit", "--key", "key_x", "--from", "2026-01-01", "--to", "soon"}, 2, "are dates"},
		{[]string{"audit", "--key", "key_x", "--from", "2026-02-01", "--to", "2026-01-31"}, 2, "--from 2026-02-01 is after --to 2026-01-31"},
		{[]string{"plan", "--account", "acct_x", "--plan", "gold"}, 2, "--plan"},
		{[]string{"refund", "chg_1"}, 2, "--reason"},
		{[]string{"dispute"}, 2, "say list, accept or reject"},
		{[]string{"dispute", "list", "all"}, 2, "takes no arguments"},
		{[]string{"dispute", "accept", "--note", "ok"}, 2, "name the dispute"},
		{[]string{"dispute", "accept", "dsp_1"}, 2, "--note TEXT is required"},
		{[]string{"dispute", "accept", "dsp_1", "--reason", "no"}, 2, "-reason"}, // reject's flag
		{[]string{"dispute", "accept", "dsp_1", "dsp_2", "--note", "ok"}, 2, `unexpected argument "dsp_2"`},
		{[]string{"setaside", "retry"}, 2, "name the set-aside event"},
		{[]string{"setaside", "skip", "seven"}, 2, "not a number"},
		{[]string{"setaside", "forget", "7"}, 2, "unknown setaside command"},
		{[]string{"nope"}, 2, `unknown command "nope"`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			dir := t.TempDir()
			env := map[string]string{"CHESSD_DATA_DIR": dir, "CHESSD_PG_PORT": "54398", "PORT": "0", "LOG_LEVEL": "error"}
			out, err := os.CreateTemp(t.TempDir(), "out")
			if err != nil {
				t.Fatal(err)
			}
			// bounded: a command that ignored its arguments would run (serve until this ends)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			runErr := run(ctx, tc.args, func(k string) string { return env[k] }, out)
			printed, _ := os.ReadFile(out.Name())
			code, msg := exitStatus(runErr)
			if code != tc.code || !strings.Contains(string(printed)+msg, tc.says) {
				t.Errorf("exit %d, printed %q, message %q; want exit %d saying %q", code, printed, msg, tc.code, tc.says)
			}
			if code == 0 && msg != "" || code != 0 && len(printed) != 0 {
				t.Errorf("help belongs on stdout and errors on stderr: printed %q, message %q", printed, msg)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("the data directory holds %v: the command opened something", entries)
			}
		})
	}
}

// A configuration the environment gets wrong is exit 2 for every server-side command,
// having opened nothing: verify's 1 means tampering, and a script must not read a bad
// variable as a tampered log.
func TestBadConfigurationIsExit2(t *testing.T) {
	for _, tc := range []struct{ name, value, says string }{
		{"PORT", "0", "PORT"},
		{"CHESSD_BASE_URL", "foo", "CHESSD_BASE_URL"},
		{"CHESSD_ENGINE_EAGER", "yes", "CHESSD_ENGINE_EAGER"},
		{"LOG_LEVEL", "bogus", "LOG_LEVEL"},
	} {
		for _, command := range []string{"verify", "serve", "replay"} {
			dir := t.TempDir()
			env := map[string]string{"CHESSD_DATA_DIR": dir, "CHESSD_PG_PORT": "54398", tc.name: tc.value}
			out, err := os.CreateTemp(t.TempDir(), "out")
			if err != nil {
				t.Fatal(err)
			}
			code, msg := exitStatus(run(context.Background(), []string{command}, func(k string) string { return env[k] }, out))
			if code != 2 || !strings.Contains(msg, tc.says) {
				t.Errorf("%s with %s=%s: exit %d, %q; want exit 2 naming %s", command, tc.name, tc.value, code, msg, tc.says)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("%s with %s=%s opened something: %v", command, tc.name, tc.value, entries)
			}
		}
	}
}

// Flags go before, between or after the positional arguments, and "--" ends them.
func TestParseArgs(t *testing.T) {
	for _, tc := range []struct {
		args       []string
		most       int
		note, pos  string
		wantErrMsg string
	}{
		{args: []string{"dsp_1", "--note", "ok"}, most: 1, note: "ok", pos: "dsp_1"},
		{args: []string{"--note", "ok", "dsp_1"}, most: 1, note: "ok", pos: "dsp_1"},
		{args: []string{"--note=ok", "dsp_1"}, most: 1, note: "ok", pos: "dsp_1"},
		{args: []string{"a", "--note", "ok", "b", "c"}, most: -1, note: "ok", pos: "a b c"},
		{args: []string{"--note", "ok", "--", "-x", "--note"}, most: -1, note: "ok", pos: "-x --note"},
		{args: nil, most: 0},
		{args: []string{"a", "b"}, most: 1, wantErrMsg: `unexpected argument "b"`},
		{args: []string{"a"}, most: 0, wantErrMsg: `takes no arguments, got "a"`},
		{args: []string{"a", "--nope"}, most: 1, wantErrMsg: "-nope"},
	} {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		note := fs.String("note", "", "")
		pos, err := parseArgs(fs, tc.args, tc.most)
		switch {
		case tc.wantErrMsg != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErrMsg) {
				t.Errorf("%q: %v, want an error saying %q", tc.args, err, tc.wantErrMsg)
			}
		case err != nil || *note != tc.note || strings.Join(pos, " ") != tc.pos:
			t.Errorf("%q: note %q, positional %q, %v; want %q, %q", tc.args, *note, pos, err, tc.note, tc.pos)
		}
	}
}

// main's exit status and message for what run returned.
func TestExitStatus(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code int
		msg  string
	}{
		{nil, 0, ""},
		{exitCode(1), 1, ""},
		{exitError{code: 2, err: errors.New("bad flag")}, 2, "bad flag"},
		{errors.New("database down"), 1, "database down"},
	} {
		if code, msg := exitStatus(tc.err); code != tc.code || msg != tc.msg {
			t.Errorf("%v: exit %d %q, want %d %q", tc.err, code, msg, tc.code, tc.msg)
		}
	}
}
