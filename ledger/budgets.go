package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"chessd/domain"
	"chessd/eventstore"
)

// The budgets the money path checks calls against (key_balances, the accounts' budgets
// and zones) are write-side state of this package. Key and account commands change
// them through these functions, in the transaction that appends the event saying so:
// the budget a call is reserved against moves with the key's or account's events, and
// no other package writes these tables.

// OpenKeyBalance creates the row a new key's calls are reserved against, with its
// budgets and its first period in the account's zone.
func OpenKeyBalance(ctx context.Context, tx *eventstore.Tx, k *domain.KeyCreated) error {
	_, err := tx.Exec(ctx, `INSERT INTO key_balances (key_id, account_id, env, budget_units, budget_usd, budget_period,
			period_start, period_end)
		SELECT $1, $2, $3, $4, $5, $6, n.period_start, n.period_end
		  FROM (SELECT) one LEFT JOIN budget_period_bounds($6, account_tz($2), now()) n ON true`,
		k.KeyID, k.AccountID, k.Env, k.BudgetUnits, k.BudgetUSD, string(k.BudgetPeriod))
	if err != nil {
		return fmt.Errorf("open the balance of key %s: %w", k.KeyID, err)
	}
	return nil
}

// CloseKeyBalance marks a revoked key's balance closed, in the revocation's transaction.
func CloseKeyBalance(ctx context.Context, tx *eventstore.Tx, keyID string, at time.Time) error {
	if _, err := tx.Exec(ctx, `UPDATE key_balances SET revoked_at = $2 WHERE key_id = $1 AND revoked_at IS NULL`, keyID, at); err != nil {
		return fmt.Errorf("close the balance of key %s: %w", keyID, err)
	}
	return nil
}

// openBalances selects the open balances of account $1, as kb: a balance opens with
// its key and closes with the revocation (revoked_at); one the revocation left open (a
// chessd older than migration 0041 revoked the key) is closed by its KeyRevoked event.
const openBalances = `FROM key_balances kb
	WHERE kb.account_id = $1 AND kb.revoked_at IS NULL
	  AND NOT EXISTS (SELECT 1 FROM events e WHERE e.stream_id = 'key-' || kb.key_id AND e.event_type = 'KeyRevoked')`

// OpenKeyBalances counts the keys of accountID's env whose balance is open: its active
// keys, exactly, within the transaction. A balance opens with its key; it closes with
// the revocation (revoked_at), and a balance the revocation left open (a chessd older
// than migration 0041 revoked the key) still does not count, by its KeyRevoked event.
func OpenKeyBalances(ctx context.Context, tx *eventstore.Tx, accountID, env string) (int, error) {
	var n int
	err := tx.QueryRow(ctx, `SELECT count(*) `+openBalances+` AND kb.env = $2`, accountID, env).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count the open balances of account %s: %w", accountID, err)
	}
	return n, nil
}

// OpenKeyIDs lists the keys of accountID, in every env, whose balance is open (its
// active keys, as OpenKeyBalances counts them), in key id order.
func OpenKeyIDs(ctx context.Context, tx *eventstore.Tx, accountID string) ([]string, error) {
	rows, err := tx.Query(ctx, `SELECT kb.key_id `+openBalances+` ORDER BY kb.key_id`, accountID)
	if err != nil {
		return nil, fmt.Errorf("the open balances of account %s: %w", accountID, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("the open balances of account %s: %w", accountID, err)
	}
	return ids, nil
}

// KeyActive says, inside q's transaction, whether keyID of accountID is active (its
// balance open, as OpenKeyBalances counts them): what a key was vouched for when its
// call began may have ended since, before the call's write (a recovery revoking every
// key of the account).
func KeyActive(ctx context.Context, q eventstore.Querier, accountID, keyID string) (bool, error) {
	var active bool
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 `+openBalances+` AND kb.key_id = $2)`, accountID, keyID).Scan(&active); err != nil {
		return false, fmt.Errorf("is key %s active: %w", keyID, err)
	}
	return active, nil
}

// SetKeyBudget gives key k the budgets it has after a change (k with the event
// applied).
func SetKeyBudget(ctx context.Context, tx *eventstore.Tx, k *domain.Key) error {
	_, err := tx.Exec(ctx, `SELECT meter_set_budget($1, $2, $3, $4)`, k.ID(), k.BudgetUnits(), k.BudgetUSD(), string(k.BudgetPeriod()))
	if err != nil {
		return fmt.Errorf("set the budget of key %s: %w", k.ID(), err)
	}
	return nil
}

// SetAccountBudget gives account accountID the budget of e, for e's env.
func SetAccountBudget(ctx context.Context, tx *eventstore.Tx, accountID string, e *domain.AccountBudgetSet) error {
	_, err := tx.Exec(ctx, `SELECT meter_set_account_budget($1, $2, $3, $4, $5)`,
		accountID, e.Env, e.BudgetUnits, e.BudgetUSD, string(e.Period))
	if err != nil {
		return fmt.Errorf("set the budget of account %s: %w", accountID, err)
	}
	return nil
}

// ZoneKnown tells whether the database knows zone tz: it computes the budgets' periods,
// so an account may only move to a zone it knows.
func ZoneKnown(ctx context.Context, tx *eventstore.Tx, tz string) (bool, error) {
	var known bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_timezone_names WHERE name = $1)`, tz).Scan(&known); err != nil {
		return false, fmt.Errorf("zone %q: %w", tz, err)
	}
	return known, nil
}

// SetAccountZone makes tz the zone whose midnights start account accountID's budget
// periods, from their next period on.
func SetAccountZone(ctx context.Context, tx *eventstore.Tx, accountID, tz string) error {
	_, err := tx.Exec(ctx, `INSERT INTO account_zones (account_id, tz) VALUES ($1, $2)
		ON CONFLICT (account_id) DO UPDATE SET tz = excluded.tz`, accountID, tz)
	if err != nil {
		return fmt.Errorf("set the zone of account %s: %w", accountID, err)
	}
	return nil
}

// KeyOverHeld says whether key keyID's budget, lowered since, no longer covers what it
// has spent this period and what its jobs hold: those jobs may charge nothing more.
func KeyOverHeld(ctx context.Context, tx *eventstore.Tx, keyID string) (bool, error) {
	var over bool
	err := tx.QueryRow(ctx, `SELECT coalesce(budget_units < period_units + held_units, false)
			OR coalesce(budget_usd < period_usd + held_usd, false)
		FROM key_periods WHERE key_id = $1`, keyID).Scan(&over)
	if err != nil {
		return false, fmt.Errorf("balance of key %s: %w", keyID, err)
	}
	return over, nil
}

// AccountOverHeld says whether account accountID's budget in env, lowered since, no
// longer covers what its keys have spent this period and what is held of it (the rule
// meter_lease grants by): the account's jobs may charge nothing more.
func AccountOverHeld(ctx context.Context, tx *eventstore.Tx, accountID, env string) (bool, error) {
	var over bool
	err := tx.QueryRow(ctx, `SELECT coalesce(budget_units < period_units + held_units, false)
			OR coalesce(floor((budget_usd - period_usd) / $3) < held_units, false)
		FROM account_periods WHERE account_id = $1 AND env = $2`, accountID, env, UnitPriceUSD).Scan(&over)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil // the account never reserved anything in env: no budget row
	}
	if err != nil {
		return false, fmt.Errorf("budget of account %s: %w", accountID, err)
	}
	return over, nil
}

// LockBalances locks the balances of keys ids until the transaction ends, in key_id
// order: the order the settles take them in (meter_settle_all), so a command moving
// two keys' budgets never waits for one while holding the other against a settle.
func LockBalances(ctx context.Context, tx *eventstore.Tx, ids ...string) error {
	if _, err := tx.Exec(ctx, `SELECT 1 FROM key_balances WHERE key_id = ANY($1) ORDER BY key_id FOR UPDATE`, ids); err != nil {
		return fmt.Errorf("lock the balances of keys %v: %w", ids, err)
	}
	return nil
}

// KeyHeadroom is what key keyID has left to hand over this period: its budget less the
// period's spend and what its calls and jobs hold (reserved and not settled yet, as a
// card's pending payments are), never below 0, nil without a budget of that kind, read
// in the command's transaction. A budgeted key's handovers come out of its budget
// (domain.Key.HandOut), so counting its reservations keeps spent + held within the
// lowered budget; a command reads it again under LockBalances before it lowers it.
func KeyHeadroom(ctx context.Context, tx *eventstore.Tx, keyID string) (domain.Headroom, error) {
	var h domain.Headroom
	// greatest() skips NULLs, so the CASE keeps "no budget" apart from "nothing left"
	err := tx.QueryRow(ctx, `SELECT
			CASE WHEN budget_units IS NOT NULL THEN greatest(0, budget_units - period_units - held_units) END,
			CASE WHEN budget_usd IS NOT NULL THEN greatest(0, budget_usd - period_usd - held_usd) END
		FROM key_periods WHERE key_id = $1`, keyID).Scan(&h.Units, &h.USD)
	if err != nil {
		return h, fmt.Errorf("balance of key %s: %w", keyID, err)
	}
	return h, nil
}
