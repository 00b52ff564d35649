-- Signet schema, first cut (SQLite).

CREATE TABLE ca_keys (
    id            TEXT PRIMARY KEY NOT NULL,
    slot          TEXT NOT NULL UNIQUE,
    algorithm     TEXT NOT NULL,
    cert_pem      TEXT NOT NULL,
    encrypted_key BLOB NOT NULL,
    created_at    INTEGER NOT NULL,
    state         TEXT NOT NULL DEFAULT 'active'
);

-- The issuance ledger: one hash-chained row per certificate.
CREATE TABLE certificates (
    seq               INTEGER PRIMARY KEY NOT NULL,
    serial            TEXT NOT NULL UNIQUE,
    spiffe_id         TEXT NOT NULL,
    dns_names         TEXT NOT NULL,  -- JSON array of strings
    ip_addresses      TEXT NOT NULL,  -- JSON array of strings
    not_before        INTEGER NOT NULL,
    not_after         INTEGER NOT NULL,
    issued_at         INTEGER NOT NULL,
    cert_sha256       BLOB NOT NULL,
    prev_hash         BLOB NOT NULL,
    hash              BLOB NOT NULL,
    cert_der          BLOB NOT NULL,
    ca_key_id         TEXT NOT NULL,
    caller            TEXT NOT NULL,
    request_id        TEXT NOT NULL,
    revoked_at        INTEGER NULL,
    revocation_reason TEXT NULL
);

CREATE INDEX certificates_spiffe_id ON certificates (spiffe_id, seq);
CREATE INDEX certificates_not_after ON certificates (not_after);

-- The chain head: a single row, moved by each appending transaction.
CREATE TABLE ledger_head (
    id   INTEGER PRIMARY KEY NOT NULL CHECK (id = 1),
    seq  INTEGER NOT NULL,
    hash BLOB NOT NULL
);

INSERT INTO ledger_head (id, seq, hash) VALUES (1, 0, zeroblob(32));

CREATE TABLE audit_events (
    id     INTEGER PRIMARY KEY AUTOINCREMENT,
    at     INTEGER NOT NULL,
    kind   TEXT NOT NULL,
    caller TEXT NOT NULL,
    detail TEXT NOT NULL
);
