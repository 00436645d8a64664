package mail_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/commands"
	"chessd/domain"
	"chessd/eventstore"
	"chessd/mail"
	"chessd/mail/mailtest"
	"chessd/postgres/pgtest"
)

// queue signs up n accounts, which queues a verification message to each.
func queue(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	h := commands.New(eventstore.NewStore(pool, slog.New(slog.DiscardHandler)), testPepper)
	for i := range n {
		if _, err := h.Signup(context.Background(), domain.Signup{Email: fmt.Sprintf("user%d@example.com", i)}, "r"); err != nil {
			t.Fatal(err)
		}
	}
}

// run runs s until the test ends.
func run(t *testing.T, s *mail.Sender) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// unsent counts the messages not marked sent.
func unsent(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM mail_outbox WHERE sent_at IS NULL`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Two servers share a slow SMTP server: each message goes out once. Each message takes
// 0.4 s of a 1 s Timeout, so six claimed at once and sent in turn would outlast a
// claim of one Timeout, and the other server would claim and send the last of them
// again. (The old code claimed for a fixed minute, which this short test cannot
// outlast: it passes on it. With its claim made one Timeout, as long as the defaults
// made it, it failed; TestLapsedClaimLeavesTheMessageToItsNewHolder fails on it as is.)
func TestTwoSendersSendEachMessageOnce(t *testing.T) {
	pool := pgtest.NewDB(t)
	other := pgtest.NewDBAt(t, pool.Config().ConnString()) // the second server's own pool
	in := mailtest.Start(t, mailtest.Config{OnData: func(int) error {
		time.Sleep(400 * time.Millisecond) // the SMTP server is slow to accept
		return nil
	}})
	const n = 6
	queue(t, pool, n)
	logger := slog.New(slog.DiscardHandler)
	cfg := mail.Config{SMTPAddr: in.Addr, Timeout: time.Second, Poll: 20 * time.Millisecond, Seal: sealer(t)}
	run(t, mail.NewSender(cfg, pool, logger))
	run(t, mail.NewSender(cfg, other, logger))

	pgtest.WaitFor(t, "every message marked sent", func() bool { return unsent(t, pool) == 0 })
	got := map[string]int{}
	for _, m := range in.Messages() {
		got[m.To[0]]++
	}
	for i := range n {
		if to := fmt.Sprintf("user%d@example.com", i); got[to] != 1 {
			t.Errorf("%s received %d messages, want 1", to, got[to])
		}
	}
	var maxAttempts int
	if err := pool.QueryRow(context.Background(), `SELECT max(attempts) FROM mail_outbox`).Scan(&maxAttempts); err != nil || maxAttempts != 1 {
		t.Fatalf("a message claimed %d times (%v), want once", maxAttempts, err)
	}
}

// A server whose claim lapsed while it was sending (paused past it: the test makes
// the claim lapse) and whose send then failed leaves the message to the server that
// claimed it since: it neither records its failure nor brings the next attempt
// forward, which would let a third server send it while the second still is.
func TestLapsedClaimLeavesTheMessageToItsNewHolder(t *testing.T) {
	pool := pgtest.NewDB(t)
	other := pgtest.NewDBAt(t, pool.Config().ConnString())
	inData := make(chan int)
	answer := map[int]chan error{1: make(chan error), 2: make(chan error)}
	in := mailtest.Start(t, mailtest.Config{OnData: func(try int) error {
		inData <- try
		return <-answer[try]
	}})
	queue(t, pool, 1)
	logger := slog.New(slog.DiscardHandler)
	cfg := mail.Config{SMTPAddr: in.Addr, Timeout: 10 * time.Second, RetryBase: time.Millisecond, Seal: sealer(t)}
	first, second := mail.NewSender(cfg, pool, logger), mail.NewSender(cfg, other, logger)
	bg := context.Background()

	firstDone := make(chan int)
	go func() { firstDone <- first.SendDue(bg) }()
	if try := pgtest.Within(t, "the first server's DATA", inData); try != 1 {
		t.Fatalf("try %d", try)
	}
	if _, err := pool.Exec(bg, `UPDATE mail_outbox SET due_at = now()`); err != nil {
		t.Fatal(err)
	}
	secondDone := make(chan int)
	go func() { secondDone <- second.SendDue(bg) }()
	if try := pgtest.Within(t, "the second server's DATA", inData); try != 2 {
		t.Fatalf("try %d", try)
	}
	answer[1] <- mailtest.TryLater
	pgtest.Within(t, "the first server to record its failure", firstDone)

	var lastError *string
	var stillClaimed bool
	var attempts int
	if err := pool.QueryRow(bg, `SELECT last_error, due_at > now() + interval '5 seconds', attempts FROM mail_outbox`).
		Scan(&lastError, &stillClaimed, &attempts); err != nil {
		t.Fatal(err)
	}
	if lastError != nil || !stillClaimed || attempts != 2 {
		t.Fatalf("after the lapsed claim's failure: error recorded %v, still claimed %v, attempts %d; want the second claim untouched",
			lastError != nil, stillClaimed, attempts)
	}
	if n := first.SendDue(bg); n != 0 {
		t.Fatalf("claimed again while the second server sends it")
	}
	answer[2] <- nil
	pgtest.Within(t, "the second server's send", secondDone)
	var via string
	if err := pool.QueryRow(bg, `SELECT sent_via FROM mail_outbox WHERE sent_at IS NOT NULL`).Scan(&via); err != nil || via != "smtp" {
		t.Fatalf("sent via %q (%v)", via, err)
	}
	if got := len(in.Messages()); got != 1 {
		t.Fatalf("%d messages received, want 1", got)
	}
}

// A server told to stop while it sends finishes that message and records it sent, and
// starts no other: after a restart each message has gone out once.
func TestStopMidSendRecordsTheSendAndStartsNoOther(t *testing.T) {
	pool := pgtest.NewDB(t)
	inData, release := make(chan struct{}), make(chan struct{})
	in := mailtest.Start(t, mailtest.Config{OnData: func(try int) error {
		if try == 1 {
			close(inData)
			<-release
		}
		return nil
	}})
	queue(t, pool, 3)
	logger := slog.New(slog.DiscardHandler)
	cfg := mail.Config{SMTPAddr: in.Addr, Poll: 20 * time.Millisecond, Seal: sealer(t)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { mail.NewSender(cfg, pool, logger).Run(ctx); close(done) }()
	pgtest.Within(t, "the first message's DATA", inData)
	cancel() // SIGTERM
	close(release)
	pgtest.Within(t, "the sender to stop", done)

	if got := len(in.Messages()); got != 1 {
		t.Fatalf("%d messages sent after the stop, want the one being sent", got)
	}
	if n := unsent(t, pool); n != 2 {
		t.Fatalf("%d messages unsent, want 2: the one sent recorded, the others left", n)
	}
	restarted := mail.NewSender(cfg, pool, logger)
	for restarted.SendDue(context.Background()) > 0 {
	}
	got := map[string]int{}
	for _, m := range in.Messages() {
		got[m.To[0]]++
	}
	if len(got) != 3 || got["user0@example.com"] != 1 || got["user1@example.com"] != 1 || got["user2@example.com"] != 1 {
		t.Fatalf("received %v, want one message to each", got)
	}
	if n := unsent(t, pool); n != 0 {
		t.Fatalf("%d messages unsent after the restart", n)
	}
}
