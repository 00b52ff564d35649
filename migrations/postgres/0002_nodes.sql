-- Node attestation and registration entries (PostgreSQL).

-- One-time join tokens: only the SHA-256 of the token is kept.
CREATE TABLE join_tokens (
    token_hash TEXT PRIMARY KEY,
    node_id    TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    used_at    BIGINT NULL
);

-- Attested agents.
CREATE TABLE nodes (
    node_id     TEXT PRIMARY KEY,
    spiffe_id   TEXT NOT NULL UNIQUE,
    attested_at BIGINT NOT NULL,
    banned_at   BIGINT NULL,
    last_serial TEXT NOT NULL,
    not_after   BIGINT NOT NULL
);

-- Registration entries. parent_id is the parent node's SPIFFE ID.
CREATE TABLE entries (
    id          TEXT PRIMARY KEY,
    spiffe_id   TEXT NOT NULL,
    parent_id   TEXT NOT NULL,
    selectors   TEXT NOT NULL,  -- JSON array of strings
    ttl_seconds BIGINT NOT NULL,
    dns_names   TEXT NOT NULL,  -- JSON array of strings
    revision    BIGINT NOT NULL,
    created_at  BIGINT NOT NULL
);

CREATE INDEX entries_parent ON entries (parent_id);

-- One global revision counter for entry changes; every create or delete takes the next value
-- and stores it as its parent's revision, so a deletion is visible to the parent's poll.
CREATE TABLE entry_revision_seq (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    value BIGINT NOT NULL
);

INSERT INTO entry_revision_seq (id, value) VALUES (1, 0);

CREATE TABLE node_revisions (
    parent_id TEXT PRIMARY KEY,
    revision  BIGINT NOT NULL
);
