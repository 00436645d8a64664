-- The mail outbox keeps no usable verification token (package mail).
--
-- A verification message's body carries its token, which email_verifications keeps
-- only as an HMAC; mail_outbox kept the body in the clear, sent or not, for good.
-- Bodies are now queued sealed under a key from the pepper and cleared once sent. A
-- migration cannot seal (the database never holds the pepper), so this clears what it
-- can: the bodies of sent messages, and of unsent ones older than a token lives (24
-- hours), which are ended (never due again, last_error says why). Younger unsent ones
-- stay sendable in the clear until a sender of this release takes them over and seals
-- them (migration 0047; mail's adoptOlder).
UPDATE mail_outbox SET body = '' WHERE sent_at IS NOT NULL AND body <> '';
UPDATE mail_outbox SET body = '', next_attempt_at = 'infinity',
       last_error = coalesce(last_error || '; ', '') || 'not sent: its token had expired when migration 0045 cleared its body'
 WHERE sent_at IS NULL AND created_at < now() - interval '24 hours';
