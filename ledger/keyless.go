package ledger

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/jackc/pgx/v5"
)

// Keyless calls are charged nothing, but each client address has a daily allowance of
// calls (decisions.md). ReserveKeyless takes one call of addr's allowance for today in
// one conditional statement, so concurrent calls cannot overdraw it; a refusal is a
// *Refusal (OutcomeKeyless). The returned function gives the call back when it
// produced no answer.
func (m *Meter) ReserveKeyless(ctx context.Context, addr netip.Addr, perDay int) (func(answered bool), error) {
	day := m.now().Format(time.DateOnly)
	var calls int
	err := m.pool.QueryRow(ctx, `INSERT INTO keyless_usage (ip, day, calls) VALUES ($1, $2, 1)
		ON CONFLICT (ip, day) DO UPDATE SET calls = keyless_usage.calls + 1 WHERE keyless_usage.calls < $3
		RETURNING calls`, addr, day, perDay).Scan(&calls)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, refusal(OutcomeKeyless)
	}
	if err != nil {
		return nil, fmt.Errorf("keyless allowance: %w", err)
	}
	return func(answered bool) {
		if answered {
			return
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := m.pool.Exec(ctx, `UPDATE keyless_usage SET calls = calls - 1 WHERE ip = $1 AND day = $2 AND calls > 0`, addr, day); err != nil {
			m.logger.Warn("give back a keyless call", "err", err)
		}
	}, nil
}
