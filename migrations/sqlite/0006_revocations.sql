-- Revocation (SQLite). A revocation is an event appended to the ledger's hash chain
-- (types/src/ledger.rs, signet-ledger-event-v1): it takes the next seq of the one chain that
-- certificates and events share, under the same ledger_head lock. certificates.revoked_at and
-- certificates.revocation_reason (0001) are a lookup index set in the same transaction; the
-- event is the record.
CREATE TABLE ledger_events (
    seq        INTEGER PRIMARY KEY NOT NULL,
    kind       TEXT NOT NULL,
    serial     TEXT NOT NULL,
    cert_seq   INTEGER NOT NULL,
    cert_hash  BLOB NOT NULL,
    reason     TEXT NOT NULL,
    at         INTEGER NOT NULL,
    caller     TEXT NOT NULL,
    request_id TEXT NOT NULL,
    detail     TEXT NOT NULL,
    prev_hash  BLOB NOT NULL,
    hash       BLOB NOT NULL
);

CREATE INDEX ledger_events_serial ON ledger_events (serial);

-- The revoked certificates of each issuing key (what its CRL lists), and selection by key.
CREATE INDEX certificates_revoked ON certificates (ca_key_id, not_after) WHERE revoked_at IS NOT NULL;
CREATE INDEX certificates_ca_key ON certificates (ca_key_id, not_after);

-- The last CRL each CA key signed: its number only increases (read and replaced under a row
-- lock, so restarts and replicas never reuse one), and replicas serve the same bytes.
CREATE TABLE crl_state (
    ca_key_id   TEXT PRIMARY KEY NOT NULL,
    number      INTEGER NOT NULL,
    der         BLOB NOT NULL,
    this_update INTEGER NOT NULL,
    next_update INTEGER NOT NULL,
    mark        INTEGER NOT NULL  -- the last ledger event seq it covers
);
