package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuTime is CPU time (user + system) used so far by this process (the servers, the
// trivial handlers, the projections, the bench itself), by the bench's PostgreSQL
// (the postmaster, its live children and those it reaped) and by the engines this
// process started and are still running (the pools' and the raw ones). With it, how
// often they went to sleep to be woken again (voluntary context switches: this
// process's threads, PostgreSQL's live processes) and how often the engines were
// preempted (involuntary ones): on cores the engines keep busy, each wake-up of
// something else takes a core from an engine, and costs more than its own work.
type cpuTime struct {
	self, pg, engines time.Duration
	selfEnd           time.Duration // self when the reading ended: scanning /proc costs this process about 10 ms
	wakes, wakesEnd   int64         // this process's voluntary switches, at the reading's start and end
	pgWakes, preempts int64
}

// since is the CPU used from reading before to reading t, leaving out the readings' own.
func (t cpuTime) since(before cpuTime) cpuTime {
	return cpuTime{self: t.self - before.selfEnd, pg: t.pg - before.pg, engines: t.engines - before.engines,
		wakes: t.wakes - before.wakesEnd, pgWakes: t.pgWakes - before.pgWakes, preempts: t.preempts - before.preempts}
}

// add sums two spans' usage.
func (t cpuTime) add(o cpuTime) cpuTime {
	return cpuTime{self: t.self + o.self, pg: t.pg + o.pg, engines: t.engines + o.engines,
		wakes: t.wakes + o.wakes, pgWakes: t.pgWakes + o.pgWakes, preempts: t.preempts + o.preempts}
}

// wakesPer formats t's wake-ups and preemptions per position of n.
func (t cpuTime) wakesPer(n float64) string {
	return fmt.Sprintf("%.0f / %.0f / %.0f", float64(t.wakes)/n, float64(t.pgWakes)/n, float64(t.preempts)/n)
}

func rusageSelf() (time.Duration, int64) {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru) //nolint:errcheck // reported as 0
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), ru.Nvcsw
}

// switches reads a task's context switches from its status file.
func switches(status string) (voluntary, involuntary int64) {
	raw, err := os.ReadFile(status)
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		name, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		switch name {
		case "voluntary_ctxt_switches":
			voluntary = n
		case "nonvoluntary_ctxt_switches":
			involuntary = n
		}
	}
	return voluntary, involuntary
}

func (b *bench) cpuNow() (t cpuTime) {
	t.self, t.wakes = rusageSelf()
	defer func() { t.selfEnd, t.wakesEnd = rusageSelf() }()
	master, ok := b.postmaster()
	if !ok {
		return t
	}
	self := strconv.Itoa(os.Getpid())
	eachProc(func(p, pid, s string, f []string) {
		// pid (comm) state ppid ... utime stime: fields 14 and 15, counted from 1
		if len(f) < 15 {
			return
		}
		if f[1] == self && strings.Contains(s, "(stockfish)") {
			for _, v := range f[11:13] {
				n, _ := strconv.ParseInt(v, 10, 64)
				t.engines += time.Duration(n) * (time.Second / 100)
			}
			tasks, _ := filepath.Glob(filepath.Join(filepath.Dir(p), "task", "*", "status"))
			for _, task := range tasks {
				_, inv := switches(task)
				t.preempts += inv
			}
			return
		}
		if pid != master && f[1] != master {
			return
		}
		vol, _ := switches(filepath.Join(filepath.Dir(p), "status"))
		t.pgWakes += vol
		ticks := int64(0)
		fields := f[11:13] // utime, stime
		if pid == master {
			fields = f[11:15] // and cutime, cstime: the backends that exited, reaped by it
		}
		for _, v := range fields {
			n, _ := strconv.ParseInt(v, 10, 64)
			ticks += n
		}
		t.pg += time.Duration(ticks) * (time.Second / 100) // USER_HZ is 100 on Linux
	})
	return t
}

// postmaster is the pid of the bench's PostgreSQL, as its data directory says.
func (b *bench) postmaster() (string, bool) {
	raw, err := os.ReadFile(filepath.Join(b.cluster.Dir, "postmaster.pid"))
	if err != nil {
		return "", false
	}
	return strings.SplitN(string(raw), "\n", 2)[0], true
}

// eachProc calls fn with each process's stat file path, its pid, the file's text and
// its fields after the command name (state, ppid, ...).
func eachProc(fn func(path, pid, stat string, fields []string)) {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range stats {
		raw, err := os.ReadFile(p)
		if err != nil {
			continue // it exited
		}
		s := string(raw)
		fn(p, s[:strings.IndexByte(s, ' ')], s, strings.Fields(s[strings.LastIndexByte(s, ')')+1:]))
	}
}

// perCall formats CPU microseconds per request: this process, PostgreSQL and wrk.
func perCall(before, after cpuTime, l load) string {
	n := float64(max(1, l.requests))
	us := func(d time.Duration) string { return strconv.FormatFloat(float64(d.Microseconds())/n, 'f', 0, 64) }
	used := after.since(before)
	return us(used.self) + " / " + us(used.pg) + " / " + us(l.cpu)
}

// besideEngine reads, cheaply enough to run between a pair's searches, the CPU this
// process (rusage) and the bench's PostgreSQL (each process's schedstat, in ns) have
// used so far: what runs beside an engine and may slow it on a machine whose two
// vCPUs share a core. Its PostgreSQL processes are those of the moment it was made.
type besideEngine struct{ pgStats []string }

func (b *bench) newBesideEngine() *besideEngine {
	be := &besideEngine{}
	master, ok := b.postmaster()
	if !ok {
		return be
	}
	eachProc(func(p, pid, _ string, f []string) {
		if len(f) > 1 && (pid == master || f[1] == master) {
			be.pgStats = append(be.pgStats, filepath.Join(filepath.Dir(p), "schedstat"))
		}
	})
	return be
}

// cpuSpan is CPU used over a span: by this process and by PostgreSQL.
type cpuSpan struct{ self, pg time.Duration }

// now is the CPU used so far (a span from the start).
func (be *besideEngine) now() cpuSpan {
	var c cpuSpan
	c.self, _ = rusageSelf()
	for _, f := range be.pgStats {
		raw, err := os.ReadFile(f)
		if err != nil {
			continue // the backend exited
		}
		if first, _, ok := strings.Cut(string(raw), " "); ok {
			ns, _ := strconv.ParseInt(first, 10, 64)
			c.pg += time.Duration(ns)
		}
	}
	return c
}

func (c cpuSpan) sub(o cpuSpan) cpuSpan { return cpuSpan{c.self - o.self, c.pg - o.pg} }
