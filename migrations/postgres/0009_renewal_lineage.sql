-- Which certificate each one renews (the serial presented over mTLS), as its own column so that
-- a revocation can follow renewals forward (server/src/store/revocations.rs) and a renewal's
-- commit can refuse a revoked parent (server/src/store/ledger.rs). The value is the provenance's
-- `renewed_from`, which the row's hash already covers; this column only indexes it.
-- Building the index and backfilling read the whole ledger once: no statement timeout here.
SET LOCAL statement_timeout = 0;
ALTER TABLE certificates ADD COLUMN renewed_from TEXT NULL;
UPDATE certificates SET renewed_from = provenance::jsonb ->> 'renewed_from'
    WHERE provenance LIKE '%"renewed_from"%';
CREATE INDEX certificates_renewed_from ON certificates (renewed_from)
    WHERE renewed_from IS NOT NULL;
