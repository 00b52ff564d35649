-- The ledger at millions of rows: every index on certificates costs each append, so none is kept
-- twice. certificates_ca_key (0006) repeats certificates_ca_key_not_after (0005) column for column.
-- Listing pages by key needs no new index: the primary key (seq) for the whole ledger, and
-- certificates_spiffe_id (spiffe_id, seq) for one SPIFFE ID, both read in either direction;
-- GetCertificate uses the serial's UNIQUE index.
DROP INDEX IF EXISTS certificates_ca_key;
