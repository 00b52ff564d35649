-- The ledger's per-key questions ask only about unrevoked certificates: whether a key still has
-- an unexpired one (the rotator's tick, `ca_keys_in_use`: one probe of this index), how many
-- (`ca status`, `ca remove`), who holds them, and which are revocable. A partial index on the
-- unrevoked rows answers all of them without reading revoked ones, and replaces
-- certificates_ca_key_not_after (0005) column for column, so an append still maintains the
-- same number of indexes. A revocation moves its row from this index to certificates_revoked
-- (0006); "any certificate of this key" asks both.
--
-- On an existing ledger this builds the index in the migration (all rows read once, appends
-- waiting meanwhile: about half a minute per ten million rows on PostgreSQL).
CREATE INDEX certificates_unrevoked ON certificates (ca_key_id, not_after) WHERE revoked_at IS NULL;
DROP INDEX IF EXISTS certificates_ca_key_not_after;
