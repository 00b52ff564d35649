-- Where the authority for each certificate came from (server/src/provenance.rs), as canonical
-- JSON; covered by the row's hash (signet-ledger-v2). Rows written before this column existed
-- keep '' and hash as signet-ledger-v1.
ALTER TABLE certificates ADD COLUMN provenance TEXT NOT NULL DEFAULT '';
