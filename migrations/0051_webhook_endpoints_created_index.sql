-- An account registers at most 20 webhook endpoints an hour per env, those deleted
-- since counted (webhook.Create): registering and deleting in a loop made thousands of
-- rows a minute, each kept 30 days. The hour's creations, deleted ones too, are found
-- by this index; webhook_endpoints_account holds the live endpoints only.
CREATE INDEX webhook_endpoints_created ON webhook_endpoints (account_id, env, created_at);
