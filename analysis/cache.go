package analysis

import (
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// cacheKey names everything that changes an unlimited search's result: the position
// (parsedFEN.normalized: the normalised FEN, canonical castling and en passant, no
// fullmove number, with its halfmove clock), the engine version and path (the wasm
// build has its own net), and Chess960 mode (castling notation). The halfmove clock changes Stockfish's answer:
// the fifty-move rule, and Stockfish 17 scales its evaluation down as the clock
// grows (one position read cp 38 / 20 / 16 at clocks 0 / 20 / 80, and a won ending
// at clock 99 is a draw); without it a cached answer at one clock was served at
// another. MultiPV and depth are matched separately: a deeper result with more lines
// answers a shallower request with fewer. Hash size and move overhead do not change
// what a depth- or time-limited search means and are left out; WDL is always computed.
func cacheKey(parsed *parsedFEN, spec Spec) string {
	return parsed.normalized + "|" + spec.Engine + "|" + string(spec.Path) + "|" + strconv.FormatBool(spec.Chess960)
}

// Cache keeps finished analyses in memory (bounded, least recently used out first) in
// front of the eval_cache table, which outlives the process and is shared by servers.
type Cache struct {
	pool   *pgxpool.Pool
	logger *slog.Logger
	limit  int

	mu    sync.Mutex
	items map[string]*list.Element
	order *list.List // front: most recently used
}

type cacheEntry struct {
	key     string
	results []stored // per stored MultiPV, deepest kept
}

// stored is a whole result with the number of lines its search was asked for. A
// position with fewer legal moves than that has a line per move, and its result
// answers every request up to the number asked: counting its lines instead missed it
// in memory at every repeat, which then read it from PostgreSQL (whose rows keep the
// number asked).
type stored struct {
	res     *Result
	multipv int
}

// NewCache makes a cache holding up to limit positions in memory.
func NewCache(pool *pgxpool.Pool, limit int, logger *slog.Logger) *Cache {
	return &Cache{pool: pool, logger: logger, limit: limit, items: map[string]*list.Element{}, order: list.New()}
}

// satisfies says whether a result searched to r's depth for asked lines answers a
// request for depth and multipv. A cached or shared result is a whole search (one cut
// short by a time limit is neither), with min(asked, legal moves) lines.
func satisfies(r *Result, asked, depth, multipv int) bool {
	return r.Depth >= depth && asked >= multipv
}

// Get finds a stored result at least depth deep with at least multipv lines.
func (c *Cache) Get(ctx context.Context, key string, depth, multipv int) (*Result, bool) {
	c.mu.Lock()
	if el, ok := c.items[key]; ok {
		c.order.MoveToFront(el)
		for _, st := range el.Value.(*cacheEntry).results {
			if satisfies(st.res, st.multipv, depth, multipv) {
				c.mu.Unlock()
				return st.res, true
			}
		}
	}
	c.mu.Unlock()
	var raw []byte
	var asked int
	err := c.pool.QueryRow(ctx, `SELECT result, multipv FROM eval_cache WHERE pos_key = $1 AND depth >= $2 AND multipv >= $3
		ORDER BY depth DESC, multipv DESC LIMIT 1`, key, depth, multipv).Scan(&raw, &asked)
	if err != nil {
		if !errors.Is(err, pgx.ErrNoRows) && ctx.Err() == nil {
			c.logger.Warn("eval cache read failed", "err", err)
		}
		return nil, false
	}
	var r Result
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, false
	}
	c.remember(key, stored{&r, asked})
	return &r, true
}

// Put stores a result in memory at once and in PostgreSQL in the background: the
// answer to the client does not wait for the write.
func (c *Cache) Put(key string, multipv int, r *Result) {
	c.remember(key, stored{r, multipv})
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.store(ctx, key, multipv, r); err != nil {
			c.logger.Warn("eval cache write failed", "err", err)
		}
	}()
}

func (c *Cache) store(ctx context.Context, key string, multipv int, r *Result) error {
	body, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = c.pool.Exec(ctx, `INSERT INTO eval_cache (pos_key, multipv, depth, result) VALUES ($1, $2, $3, $4)
		ON CONFLICT (pos_key, multipv) DO UPDATE SET depth = excluded.depth, result = excluded.result, created_at = now()
		WHERE excluded.depth > eval_cache.depth`, key, multipv, r.Depth, body)
	return err
}

// remember keeps r in memory, replacing a stored result it is at least as good as.
func (c *Cache) remember(key string, r stored) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.items[key]
	if !ok {
		el = c.order.PushFront(&cacheEntry{key: key})
		c.items[key] = el
		for c.order.Len() > c.limit {
			old := c.order.Back()
			c.order.Remove(old)
			delete(c.items, old.Value.(*cacheEntry).key)
		}
	}
	c.order.MoveToFront(el)
	e := el.Value.(*cacheEntry)
	kept := e.results[:0]
	for _, have := range e.results {
		if !satisfies(r.res, r.multipv, have.res.Depth, have.multipv) {
			kept = append(kept, have) // have still answers something r does not
		}
	}
	e.results = append(kept, r)
}

// Forget empties the in-memory layer (the benchmarks measure the PostgreSQL layer too).
func (c *Cache) Forget() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.items, c.order = map[string]*list.Element{}, list.New()
}
