-- The key that handed a key its budget out of its own (domain.Key.HandOut), as the key
-- record shows it: null for a key budgeted by a key without a budget, by the account's
-- signup, or before handovers existed. The accounts projection writes it from
-- KeyCreated, KeyUpdated and KeyRotated; a rebuild fills it from the events.
ALTER TABLE api_keys ADD COLUMN budget_from text;
