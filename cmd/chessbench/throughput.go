package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"chessd/eventstore"
	"chessd/ledger"
	"chessd/postgres"
	"chessd/projections"
)

// cachedAll measures cached POST /eval throughput, charged (with a key) and keyless,
// against the trivial handler driven by the same wrk command right before, at several
// connection counts, and the usage projection's lag during the charged runs.
func (b *bench) cachedAll(d time.Duration, connCounts []int) error {
	fmt.Printf("\n## Cached POST /eval throughput against a trivial Go JSON handler (one server)\n\n")
	fmt.Printf("wrk, %d threads, keep-alive, %s per run, the 10 positions at depth 10 (cached), rate limits off.\n", wrkThreads, d)
	fmt.Println("trivial: an http.Server in the same process whose handler decodes the same body and encodes a small JSON answer,")
	fmt.Println("driven by the same wrk command (same script, connections, threads, duration) right before the service's runs.")
	fmt.Println("charged: with a key (authenticated, caps, reserved from the lease, one line per call in its key's ChargesSettled event of each group commit);")
	fmt.Println("keyless: no Authorization header (the per-address daily allowance, taken in blocks held in memory).")
	fmt.Println()
	charged, keyless, trivial, err := b.prepare(b.replicas[:1])
	if err != nil {
		return err
	}
	fmt.Println("| connections | trivial req/s | charged req/s | **charged / trivial** | keyless req/s | **keyless / trivial** | p50 trivial / charged / keyless | p99 trivial / charged / keyless | non-2xx |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	var lags, cpus []string
	for _, conns := range connCounts {
		base, err := b.runWrk(trivial, conns, d, charged)
		if err != nil {
			return err
		}
		ch, lag, err := b.chargedRun([]string{b.url}, conns, d, charged)
		if err != nil {
			return err
		}
		kl, err := b.runWrk([]string{b.url}, conns, d, keyless)
		if err != nil {
			return err
		}
		fmt.Printf("| %d | %.0f | %.0f | **%.2f** | %.0f | **%.2f** | %s / %s / %s | %s / %s / %s | %d |\n", conns, base.rate,
			ch.rate, ch.rate/base.rate, kl.rate, kl.rate/base.rate, base.p50, ch.p50, kl.p50, base.p99, ch.p99, kl.p99, ch.non2+kl.non2)
		lags = append(lags, fmt.Sprintf("| %d | %d | %s |", conns, ch.requests, lag))
		cpus = append(cpus, fmt.Sprintf("| %d | %s | %s | %s |", conns, base.cpuPer, ch.cpuPer, kl.cpuPer))
	}
	b.printLags("connections", lags)
	printCPU(cpus)
	return nil
}

// replicasAll repeats the cached runs against two servers on one database: one wrk
// process per server, half the connections each, the rates summed; the trivial
// baseline is two handlers driven the same way.
func (b *bench) replicasAll(ctx context.Context, logger *slog.Logger, d time.Duration) error {
	if len(b.replicas) < 2 {
		if _, _, err := b.addReplica(logger); err != nil {
			return err
		}
	}
	fmt.Printf("\n## The same with two replicas on one database\n\n")
	fmt.Println("A second server in the same process with its own connection pool, event store, meter (its own leases and settler),")
	fmt.Println("authenticator and analysis service, on its own port; the projection runner and the engines are shared.")
	fmt.Println("One wrk process per server (half the connections and one thread each), at once; the same key and the same address on both.")
	fmt.Println()
	urls := []string{b.replicas[0].url, b.replicas[1].url}
	charged, keyless, trivial, err := b.prepare(b.replicas[:2])
	if err != nil {
		return err
	}
	fmt.Println("| connections | trivial ×2 req/s | charged req/s | **charged / trivial** | keyless req/s | **keyless / trivial** | p50 charged (each server) | p99 charged (each server) | non-2xx |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	var lags, cpus []string
	var profile []postgres.Statement
	for _, conns := range []int{32, 64} {
		base, err := b.runWrk(trivial, conns, d, charged)
		if err != nil {
			return err
		}
		if err := postgres.StartStatements(ctx, b.pool); err != nil {
			return err
		}
		ch, lag, err := b.chargedRun(urls, conns, d, charged)
		if err != nil {
			return err
		}
		if profile, err = postgres.TopStatements(ctx, b.pool, 10); err != nil {
			return err
		}
		profile = append(profile, postgres.Statement{Calls: int64(ch.requests)}) // per answered call
		kl, err := b.runWrk(urls, conns, d, keyless)
		if err != nil {
			return err
		}
		fmt.Printf("| %d | %.0f | %.0f | **%.2f** | %.0f | **%.2f** | %s | %s | %d |\n", conns, base.rate, ch.rate, ch.rate/base.rate,
			kl.rate, kl.rate/base.rate, ch.p50, ch.p99, ch.non2+kl.non2)
		lags = append(lags, fmt.Sprintf("| %d | %d | %s |", conns, ch.requests, lag))
		cpus = append(cpus, fmt.Sprintf("| %d | %s | %s | %s |", conns, base.cpuPer, ch.cpuPer, kl.cpuPer))
	}
	b.printLags("connections", lags)
	printCPU(cpus)
	printStatements("two servers and 64 connections", profile)
	return nil
}

// accountsAll measures charges per second against the number of distinct accounts: each
// request takes the next account's key in turn.
func (b *bench) accountsAll(ctx context.Context, d time.Duration) error {
	const conns = 32
	counts := []int{1, 4, 16, 64}
	keys, err := b.signup(ctx, counts[len(counts)-1], "account")
	if err != nil {
		return err
	}
	fmt.Printf("\n## Charges per second against the number of accounts (one server)\n\n")
	fmt.Printf("wrk, %d connections, %d threads, %s per run, cached POST /eval; each request takes the next account's key in turn\n", conns, wrkThreads, d)
	fmt.Println("(one key per account, pro plan, each warmed by one call: its lease and remembered key exist before the run).")
	fmt.Println("charges per commit: the ledger events the run added over the transactions that wrote them (distinct xmin).")
	fmt.Println()
	b.svc.EnableCache()
	for i, k := range keys {
		if err := b.post(b.url, "/eval", fmt.Sprintf(`{"fen":%q,"depth":10}`, positions[i%len(positions)]), k, nil); err != nil {
			return err
		}
	}
	all, err := b.script("accounts", keys)
	if err != nil {
		return err
	}
	trivial, err := b.trivialURLs(1)
	if err != nil {
		return err
	}
	base, err := b.runWrk(trivial, conns, d, all)
	if err != nil {
		return err
	}
	fmt.Printf("trivial handler, same command: %.0f requests/s (CPU µs per call: %s).\n\n", base.rate, base.cpuPer)
	fmt.Println("| accounts | requests/s | / trivial | p50 | p99 | non-2xx | charges recorded | charges per commit | CPU µs per call: chessd / PostgreSQL / wrk |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	var lags []string
	profiles := map[int][]postgres.Statement{}
	for _, n := range counts {
		script, err := b.script(fmt.Sprintf("accounts-%d", n), keys[:n])
		if err != nil {
			return err
		}
		if err := postgres.StartStatements(ctx, b.pool); err != nil {
			return err
		}
		from := b.head()
		l, lag, err := b.chargedRun([]string{b.url}, conns, d, script)
		if err != nil {
			return err
		}
		charges, commits := b.chargesSince(from)
		if profiles[n], err = postgres.TopStatements(ctx, b.pool, 10); err != nil {
			return err
		}
		profiles[n] = append(profiles[n], postgres.Statement{Calls: charges}) // the run's charges, last
		fmt.Printf("| %d | **%.0f** | %.2f | %s | %s | %d | %d | %.1f | %s |\n", n, l.rate, l.rate/base.rate, l.p50, l.p99, l.non2,
			charges, float64(charges)/float64(max(1, commits)), l.cpuPer)
		lags = append(lags, fmt.Sprintf("| %d | %d | %s |", n, l.requests, lag))
	}
	b.printLags("accounts", lags)
	for _, n := range []int{counts[0], counts[len(counts)-1]} {
		printStatements(fmt.Sprintf("%d account(s)", n), profiles[n])
	}
	return nil
}

// printStatements prints where PostgreSQL spent its time during one run, from
// pg_stat_statements: the statements that took most, per charge (the last entry of
// top holds the run's charges).
func printStatements(run string, top []postgres.Statement) {
	printStatementsPer(run, "charge", top)
}

// printStatementsPer is printStatements with the times per unit (the count last in top).
func printStatementsPer(run, unit string, top []postgres.Statement) {
	charges := max(1, top[len(top)-1].Calls)
	fmt.Printf("\nPostgreSQL's time by statement during the run with %s (pg_stat_statements, top 10 by time;\n", run)
	fmt.Println("a function's statements count in it and on their own lines too; time includes waiting for row locks):")
	fmt.Println()
	fmt.Printf("| statement | calls | rows | ms | µs per %s |\n", unit)
	fmt.Println("|---|---|---|---|---|")
	for _, st := range top[:len(top)-1] {
		fmt.Printf("| `%s` | %d | %d | %.0f | %.1f |\n", strings.ReplaceAll(st.Query, "|", "\\|"), st.Calls, st.Rows, st.TotalMS,
			st.TotalMS*1000/float64(charges))
	}
}

func printCPU(rows []string) {
	fmt.Println()
	fmt.Println("CPU per request, µs, over each run: this process (servers, projections, bench) / the bench's PostgreSQL / wrk.")
	fmt.Println("The machine's cores bound the sum: at 2 cores, 2,000,000 µs of CPU per second.")
	fmt.Println()
	fmt.Println("| connections | trivial | charged | keyless |")
	fmt.Println("|---|---|---|---|")
	for _, r := range rows {
		fmt.Println(r)
	}
}

// warm evaluates the positions once on r (with the cache on), so that the runs hit it.
// prepare warms each server's cache and leases, writes the charged and keyless wrk
// scripts, and starts a trivial handler per server.
func (b *bench) prepare(servers []*replica) (charged, keyless string, trivial []string, err error) {
	for _, r := range servers {
		if err := b.warm(r); err != nil {
			return "", "", nil, err
		}
	}
	if charged, err = b.script("charged", []string{b.key}); err != nil {
		return "", "", nil, err
	}
	if keyless, err = b.script("keyless", nil); err != nil {
		return "", "", nil, err
	}
	trivial, err = b.trivialURLs(len(servers))
	return charged, keyless, trivial, err
}

func (b *bench) warm(r *replica) error {
	r.svc.EnableCache()
	for _, fen := range positions {
		if err := b.post(r.url, "/eval", fmt.Sprintf(`{"fen":%q,"depth":10}`, fen), b.key, nil); err != nil {
			return err
		}
	}
	return nil
}

// chargedRun runs wrk while watching the usage projection's lag, waits for the
// projection to catch up, and returns the load and a table row's lag cells.
func (b *bench) chargedRun(urls []string, conns int, d time.Duration, script string) (load, string, error) {
	from := b.head()
	stop := b.watchLag()
	l, err := b.runWrk(urls, conns, d, script)
	lag := stop()
	charges, _ := b.chargesSince(from)
	return l, fmt.Sprintf("%d | %d | **%.0f ms** | %.0f | %s", charges, lag.maxEvents, ms(lag.maxAge), lag.meanEvents, lag.catchUp), err
}

func (b *bench) printLags(first string, rows []string) {
	fmt.Println()
	fmt.Println("Usage projection lag during the charged runs, sampled every 50 ms: how far the ledger projection (charges, credits,")
	fmt.Println("what GET /usage reads) is behind the event log's head, in events and as the age of the oldest event it has not applied.")
	fmt.Println("Charges recorded exceed wrk's count by the calls still in flight when wrk stopped counting.")
	fmt.Println()
	fmt.Printf("| %s | requests (wrk) | charges recorded | lag max (events) | **lag max (age)** | lag mean (events) | caught up after the load |\n", first)
	fmt.Println("|---|---|---|---|---|---|---|")
	for _, r := range rows {
		fmt.Println(r)
	}
}

// head is the event log's last position.
func (b *bench) head() int64 {
	n, _ := eventstore.Head(context.Background(), b.pool) // reported as 0 on error
	return n
}

// chargesSince counts the charges recorded after position from, and the transactions that
// committed them, once every server's settler has committed what it answered.
func (b *bench) chargesSince(from int64) (charges, commits int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, r := range b.replicas {
		r.meter.Flush(ctx) //nolint:errcheck // a settle that failed shows as fewer charges
	}
	charges, commits, _ = ledger.ChargesSince(ctx, b.pool, from) // reported as 0 on error
	return charges, commits
}

type lagStats struct {
	maxEvents  int64
	meanEvents float64
	maxAge     time.Duration
	catchUp    string
}

// lag is how far the ledger projection's checkpoint is behind the log's head, in events
// and as the age of the first event past it (zero when caught up).
func (b *bench) lag() (int64, time.Duration) {
	n, age, _ := projections.Behind(context.Background(), b.pool, projections.Ledger{}.Name()) // sampled: 0 on error
	return n, age
}

// watchLag samples the projection lag until the returned function is called; that
// function then waits (up to 10 s) for the projection to catch up.
func (b *bench) watchLag() func() lagStats {
	stop := make(chan struct{})
	var st lagStats
	var sum, samples int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				n, age := b.lag()
				st.maxEvents, st.maxAge = max(st.maxEvents, n), max(st.maxAge, age)
				sum += n
				samples++
			}
		}
	}()
	return func() lagStats {
		close(stop)
		<-done
		st.meanEvents = float64(sum) / float64(max(1, samples))
		start := time.Now()
		for {
			if n, _ := b.lag(); n <= 0 {
				st.catchUp = time.Since(start).Round(time.Millisecond).String()
				return st
			}
			if time.Since(start) > 10*time.Second {
				st.catchUp = "not within 10s"
				return st
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}
