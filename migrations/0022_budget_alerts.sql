-- Budget alerts: which thresholds of a key's units budget its spend has crossed and was
-- told of. A row is the crossing, written once (whatever server sees it first); it is
-- removed when the spend falls back under the threshold (a refund) or the budget moves
-- above it, so the next crossing is told again.
CREATE TABLE budget_alerts (
    key_id     text        NOT NULL,
    threshold  int         NOT NULL, -- percent of the budget
    budget     bigint      NOT NULL, -- the budget crossed
    spent      bigint      NOT NULL, -- the spend when it was seen
    crossed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (key_id, threshold)
);
