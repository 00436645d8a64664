-- Finished analyses, reused by later requests for the same position, engine and
-- result-changing options (analysis/cache.go). Not a read model: a cache that may be
-- emptied at any time.
CREATE TABLE eval_cache (
    pos_key    text        NOT NULL, -- normalised FEN | engine id | path | chess960
    multipv    int         NOT NULL,
    depth      int         NOT NULL,
    result     jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pos_key, multipv)
);

-- Calls without a key, per client address and UTC day (the keyless allowance).
CREATE TABLE keyless_usage (
    ip    inet   NOT NULL,
    day   date   NOT NULL,
    calls int    NOT NULL,
    PRIMARY KEY (ip, day)
);
