package main

import (
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
// process started and are still running (the pools' and the raw ones).
type cpuTime struct {
	self, pg, engines time.Duration
	selfEnd           time.Duration // self when the reading ended: scanning /proc costs this process about 10 ms
}

// since is the CPU used from reading before to reading t, leaving out the readings' own.
func (t cpuTime) since(before cpuTime) cpuTime {
	return cpuTime{self: t.self - before.selfEnd, pg: t.pg - before.pg, engines: t.engines - before.engines}
}

func rusageSelf() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru) //nolint:errcheck // reported as 0
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func (b *bench) cpuNow() (t cpuTime) {
	t.self = rusageSelf()
	defer func() { t.selfEnd = rusageSelf() }()
	raw, err := os.ReadFile(filepath.Join(b.cluster.Dir, "postmaster.pid"))
	if err != nil {
		return t
	}
	master := strings.SplitN(string(raw), "\n", 2)[0]
	self := strconv.Itoa(os.Getpid())
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range stats {
		stat, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ... utime stime: fields 14 and 15, counted from 1
		s := string(stat)
		pid := s[:strings.IndexByte(s, ' ')]
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 15 {
			continue
		}
		if f[1] == self && strings.Contains(s, "(stockfish)") {
			for _, v := range f[11:13] {
				n, _ := strconv.ParseInt(v, 10, 64)
				t.engines += time.Duration(n) * (time.Second / 100)
			}
			continue
		}
		if pid != master && f[1] != master {
			continue
		}
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
	}
	return t
}

// perCall formats CPU microseconds per request: this process, PostgreSQL and wrk.
func perCall(before, after cpuTime, l load) string {
	n := float64(max(1, l.requests))
	us := func(d time.Duration) string { return strconv.FormatFloat(float64(d.Microseconds())/n, 'f', 0, 64) }
	used := after.since(before)
	return us(used.self) + " / " + us(used.pg) + " / " + us(l.cpu)
}
