-- Positions start at 1: the chain's walk (chessd verify) starts after 0, so an event
-- stored at 0 or below escaped it while streams' readers (by stream and version) still
-- folded it in. Verify also counts every row now; this check refuses such a row outright.
ALTER TABLE events ADD CONSTRAINT events_position_positive CHECK (position > 0);
