-- replay / reference (d): a plain primary-key SELECT of the same row of idem_keys itself (the
-- keys that the extension's variant replays): the physical limit of a replay
\set i random(1, :nkeys)
SELECT * FROM idem_keys
 WHERE scope = 'POST /payments' AND key = md5(:i::text)::uuid::text;
