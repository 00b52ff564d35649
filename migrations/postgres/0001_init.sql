-- Signet schema, first cut (PostgreSQL).

CREATE TABLE ca_keys (
    id            TEXT PRIMARY KEY,
    slot          TEXT NOT NULL UNIQUE,
    algorithm     TEXT NOT NULL,
    cert_pem      TEXT NOT NULL,
    encrypted_key BYTEA NOT NULL,
    created_at    BIGINT NOT NULL,
    state         TEXT NOT NULL DEFAULT 'active'
);

-- The issuance ledger: one hash-chained row per certificate.
CREATE TABLE certificates (
    seq               BIGINT PRIMARY KEY,
    serial            TEXT NOT NULL UNIQUE,
    spiffe_id         TEXT NOT NULL,
    dns_names         TEXT NOT NULL,  -- JSON array of strings
    ip_addresses      TEXT NOT NULL,  -- JSON array of strings
    not_before        BIGINT NOT NULL,
    not_after         BIGINT NOT NULL,
    issued_at         BIGINT NOT NULL,
    cert_sha256       BYTEA NOT NULL,
    prev_hash         BYTEA NOT NULL,
    hash              BYTEA NOT NULL,
    cert_der          BYTEA NOT NULL,
    ca_key_id         TEXT NOT NULL,
    caller            TEXT NOT NULL,
    request_id        TEXT NOT NULL,
    revoked_at        BIGINT NULL,
    revocation_reason TEXT NULL
);

CREATE INDEX certificates_spiffe_id ON certificates (spiffe_id, seq);
CREATE INDEX certificates_not_after ON certificates (not_after);

-- The chain head: a single row, locked by each appending transaction.
CREATE TABLE ledger_head (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    seq  BIGINT NOT NULL,
    hash BYTEA NOT NULL
);

INSERT INTO ledger_head (id, seq, hash)
VALUES (1, 0, '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea);

CREATE TABLE audit_events (
    id     BIGSERIAL PRIMARY KEY,
    at     BIGINT NOT NULL,
    kind   TEXT NOT NULL,
    caller TEXT NOT NULL,
    detail TEXT NOT NULL
);
