-- Node attestation and registration entries (SQLite).

-- One-time join tokens: only the SHA-256 of the token is kept.
CREATE TABLE join_tokens (
    token_hash TEXT PRIMARY KEY NOT NULL,
    node_id    TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    used_at    INTEGER NULL
);

-- Attested agents.
CREATE TABLE nodes (
    node_id     TEXT PRIMARY KEY NOT NULL,
    spiffe_id   TEXT NOT NULL UNIQUE,
    attested_at INTEGER NOT NULL,
    banned_at   INTEGER NULL,
    last_serial TEXT NOT NULL,
    not_after   INTEGER NOT NULL
);

-- Registration entries. parent_id is the parent node's SPIFFE ID.
CREATE TABLE entries (
    id          TEXT PRIMARY KEY NOT NULL,
    spiffe_id   TEXT NOT NULL,
    parent_id   TEXT NOT NULL,
    selectors   TEXT NOT NULL,  -- JSON array of strings
    ttl_seconds INTEGER NOT NULL,
    dns_names   TEXT NOT NULL,  -- JSON array of strings
    revision    INTEGER NOT NULL,
    created_at  INTEGER NOT NULL
);

CREATE INDEX entries_parent ON entries (parent_id);

-- One global revision counter for entry changes; every create or delete takes the next value
-- and stores it as its parent's revision, so a deletion is visible to the parent's poll.
CREATE TABLE entry_revision_seq (
    id    INTEGER PRIMARY KEY NOT NULL CHECK (id = 1),
    value INTEGER NOT NULL
);

INSERT INTO entry_revision_seq (id, value) VALUES (1, 0);

CREATE TABLE node_revisions (
    parent_id TEXT PRIMARY KEY NOT NULL,
    revision  INTEGER NOT NULL
);
