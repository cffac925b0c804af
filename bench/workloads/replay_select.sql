-- replay / reference (d): a plain primary-key SELECT of the same row: the physical limit of a replay
\set i random(1, :nkeys)
SELECT * FROM ref.keys_a
 WHERE scope = 'POST /payments' AND key = md5(:i::text)::uuid::text;
