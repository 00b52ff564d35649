-- Revocation (PostgreSQL). A revocation is an event appended to the ledger's hash chain
-- (types/src/ledger.rs, signet-ledger-event-v1): it takes the next seq of the one chain that
-- certificates and events share, under the same ledger_head lock. certificates.revoked_at and
-- certificates.revocation_reason (0001) are a lookup index set in the same transaction; the
-- event is the record.
CREATE TABLE ledger_events (
    seq        BIGINT PRIMARY KEY,
    kind       TEXT NOT NULL,
    serial     TEXT NOT NULL,
    cert_seq   BIGINT NOT NULL,
    cert_hash  BYTEA NOT NULL,
    reason     TEXT NOT NULL,
    at         BIGINT NOT NULL,
    caller     TEXT NOT NULL,
    request_id TEXT NOT NULL,
    detail     TEXT NOT NULL,
    prev_hash  BYTEA NOT NULL,
    hash       BYTEA NOT NULL
);

CREATE INDEX ledger_events_serial ON ledger_events (serial);

-- The revoked certificates of each issuing key (what its CRL lists), and selection by key.
CREATE INDEX certificates_revoked ON certificates (ca_key_id, not_after) WHERE revoked_at IS NOT NULL;
CREATE INDEX certificates_ca_key ON certificates (ca_key_id, not_after);

-- The last CRL each CA key signed: its number only increases (read and replaced under a row
-- lock, so restarts and replicas never reuse one), and replicas serve the same bytes.
CREATE TABLE crl_state (
    ca_key_id   TEXT PRIMARY KEY,
    number      BIGINT NOT NULL,
    der         BYTEA NOT NULL,
    this_update BIGINT NOT NULL,
    next_update BIGINT NOT NULL,
    mark        BIGINT NOT NULL  -- the last ledger event seq it covers
);
