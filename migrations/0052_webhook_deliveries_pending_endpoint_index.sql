-- A test delivery is refused while its endpoint has MaxTestPings of them still to go
-- (webhook.Ping): a slow endpoint's pings otherwise piled up without end, and every
-- claim of every server walks past the pending ones. They are counted by this index,
-- the pending deliveries of one endpoint, not by a read of all its deliveries.
CREATE INDEX webhook_deliveries_pending_endpoint ON webhook_deliveries (endpoint_id)
    WHERE delivered_at IS NULL AND failed_at IS NULL;
