package projections

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"chessd/domain"
	"chessd/eventstore"
	"chessd/ledger"
)

// AsOfMargin is how far in the past an as-of instant must be: every event recorded
// before it has committed by then, so the view of it never changes again.
const AsOfMargin = time.Minute

// AsOfView is what an account's /me, /keys and /usage said at one instant, folded
// from the events recorded up to it (`chessd replay --as-of`).
type AsOfView struct {
	At      time.Time
	Account *domain.Account
	Keys    []*domain.Key // in creation order
	// Usage is per key: what was charged and credited up to At (all time), as /usage
	// totals it.
	Usage map[string]*AsOfUsage
	// Events is how many events the view folded.
	Events int
}

// AsOfUsage is one key's charges and credits.
type AsOfUsage struct {
	Calls, Units, Credits, CreditedUnits int64
	USD, CreditedUSD                     decimal.Decimal
}

// AsOf folds the events of accountID as GET /usage's as_of and the account's state
// stood at at: the account's and keys' events recorded at or before it, and the calls
// charged (answered) and the credits made before it, whenever their events were
// recorded (a call answered a moment before at is settled a moment after; /usage
// counts it, so does this). A charge commits within 30 s of its answer, so the events
// recorded up to AsOfMargin after at hold every one. It refuses an instant less than
// AsOfMargin ago.
func AsOf(ctx context.Context, q eventstore.Querier, accountID string, at, now time.Time) (*AsOfView, error) {
	if at.After(now.Add(-AsOfMargin)) {
		return nil, fmt.Errorf("as of %s: must be at least %v ago (later events may still be committing)", at.Format(time.RFC3339), AsOfMargin)
	}
	rows, err := q.Query(ctx, `SELECT stream_id, event_type, schema_version, payload, recorded_at <= $2 FROM events
		WHERE metadata->>'account_id' = $1 AND recorded_at <= $3 ORDER BY position`, accountID, at, at.Add(AsOfMargin))
	if err != nil {
		return nil, fmt.Errorf("as of: %w", err)
	}
	type stored struct {
		stream, typ string
		version     int
		payload     []byte
		by          bool // recorded at or before at
	}
	evs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (stored, error) {
		var s stored
		err := r.Scan(&s.stream, &s.typ, &s.version, &s.payload, &s.by)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("as of: %w", err)
	}
	v := &AsOfView{At: at, Account: domain.RehydrateAccount(nil), Usage: map[string]*AsOfUsage{}}
	keys := map[string]*domain.Key{}
	usage := func(keyID string) *AsOfUsage {
		u := v.Usage[keyID]
		if u == nil {
			u = &AsOfUsage{USD: decimal.Zero, CreditedUSD: decimal.Zero}
			v.Usage[keyID] = u
		}
		return u
	}
	for _, s := range evs {
		e, err := domain.Decode(s.typ, s.version, s.payload)
		if err != nil {
			return nil, fmt.Errorf("as of: %s: %w", s.stream, err)
		}
		folded := true
		switch x := e.(type) {
		case *domain.AccountCreated, *domain.PlanChanged, *domain.EmailVerified, *domain.TimezoneSet, *domain.AccountBudgetSet:
			if folded = s.by; folded {
				v.Account.Apply(e)
			}
		case *domain.KeyCreated, *domain.KeyUpdated, *domain.KeyRotated, *domain.KeyRevoked:
			if folded = s.by; !folded {
				break
			}
			k := keys[s.stream]
			if k == nil {
				k = domain.RehydrateKey(nil)
				keys[s.stream] = k
			}
			k.Apply(e)
		case *ledger.UnitsCharged:
			if folded = x.ChargedAt.Before(at); folded {
				u := usage(x.KeyID)
				u.Calls, u.Units, u.USD = u.Calls+1, u.Units+x.Units, u.USD.Add(x.USD)
			}
		case *ledger.ChargesSettled:
			folded = false
			for _, l := range x.Lines {
				if l.ChargedAt.Before(at) {
					u := usage(x.KeyID)
					u.Calls, u.Units, u.USD, folded = u.Calls+1, u.Units+l.Units, u.USD.Add(l.USD), true
				}
			}
		case *ledger.UnitsCredited:
			if folded = x.CreditedAt.Before(at); folded {
				u := usage(x.KeyID)
				u.Credits, u.CreditedUnits, u.CreditedUSD = u.Credits+1, u.CreditedUnits+x.Units, u.CreditedUSD.Add(x.USD)
			}
		default:
			folded = s.by
		}
		if folded {
			v.Events++
		}
	}
	if !v.Account.Exists() {
		return nil, domain.Errorf(domain.CodeNotFound, "no account %q as of %s", accountID, at.Format(time.RFC3339))
	}
	for _, k := range keys {
		v.Keys = append(v.Keys, k)
	}
	sort.Slice(v.Keys, func(i, j int) bool { return v.Keys[i].CreatedAt().Before(v.Keys[j].CreatedAt()) })
	return v, nil
}
