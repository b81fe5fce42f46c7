-- The on-disk size of a subscription row and of its index entries (docs/scaling.md): 100,000 recipients
-- (APNs-shaped targets), 1,000,000 subscriptions (10 a recipient, 5 a group topic, three 42-byte HMAC keys),
-- keyed by hashes of the row number so rows reach the indexes in random order, as registrations do. Run it
-- in a fresh database `xmtp-push migrate` set up: psql -h 127.0.0.1 -U postgres -d DB -f bench/row_size.sql
INSERT INTO recipients (id, secret_hash, channel, target, signing_key, topic_count, created_ns, renewed_ns)
SELECT sha256(int8send(r)), sha256(int8send(-r)), 1, encode(sha256(int8send(r + 1000000000)), 'hex'),
       NULL, 10, 1700000000000000000, 1700000000000000000 + r
FROM generate_series(1::bigint, 100000) AS r;
INSERT INTO subscriptions (topic, recipient_id, start_ns, hmac_epoch_base, hmac_keys, include_commits)
SELECT '\x00'::bytea || substring(sha256(int8send(s / 5)) from 1 for 16),
       sha256(int8send(((s * 7919) % 100000) + 1)), 1700000000000000000 + s, 1700000000000000000,
       substring(sha512(int8send(s)) || sha512(int8send(-s)) from 1 for 126), false
FROM generate_series(0::bigint, 999999) AS s;
VACUUM ANALYZE recipients, subscriptions;
SELECT relname, reltuples::bigint AS rows, pg_relation_size(oid) AS bytes,
       round(pg_relation_size(oid)::numeric / 1000000, 1) AS bytes_per_subscription FROM pg_class
WHERE relname IN ('subscriptions', 'pk_subscriptions', 'ix_subscriptions_recipient_id', 'recipients', 'pk_recipients', 'ix_recipients_renewed_ns')
ORDER BY relname;
SELECT pg_total_relation_size('subscriptions') AS subscriptions_total, pg_total_relation_size('recipients') AS recipients_total,
       (SELECT avg(pg_column_size(s.*))::int FROM subscriptions s) AS avg_subscription_tuple_bytes,
       (SELECT avg(pg_column_size(r.*))::int FROM recipients r) AS avg_recipient_tuple_bytes;
