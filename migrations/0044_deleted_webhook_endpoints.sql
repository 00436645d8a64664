-- A deleted webhook endpoint's pending deliveries end, failed with last_error
-- 'endpoint deleted' (webhook.DeletedError).
--
-- The sender's claim did not look at the endpoint's deleted_at, so the deliveries
-- queued before a DELETE, and their retries, still went out. DELETE now ends them in its
-- statement and the claim skips a deleted endpoint's; this ends those that earlier
-- deletions left pending, which servers not yet upgraded would otherwise still send.
UPDATE webhook_deliveries d SET failed_at = now(), last_error = 'endpoint deleted'
  FROM webhook_endpoints e
 WHERE e.endpoint_id = d.endpoint_id AND e.deleted_at IS NOT NULL
   AND d.delivered_at IS NULL AND d.failed_at IS NULL;
