-- JWT-SVIDs on the ledger, and each entry's JWT-SVID lifetime.
--
-- Every JWT-SVID the server mints is a row of the one hash chain (types/src/ledger.rs,
-- signet-ledger-jwt-v1): its seq is the next of the chain that certificates and ledger_events
-- share, appended under the same ledger_head lock, in the same group-commit transactions as
-- certificates. The row commits to the token's SHA-256, never the token.
CREATE TABLE jwt_svids (
    seq          INTEGER PRIMARY KEY NOT NULL,
    spiffe_id    TEXT NOT NULL,
    audience     TEXT NOT NULL,  -- JSON array of strings, in the token's order
    issued_at    INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL,
    key_id       TEXT NOT NULL,
    token_sha256 BLOB NOT NULL,
    caller       TEXT NOT NULL,
    request_id   TEXT NOT NULL,
    provenance   TEXT NOT NULL,
    prev_hash    BLOB NOT NULL,
    hash         BLOB NOT NULL
);

CREATE INDEX jwt_svids_spiffe_id ON jwt_svids (spiffe_id, seq);
CREATE INDEX jwt_svids_expires_at ON jwt_svids (expires_at);

-- The JWT-SVID lifetime of an entry's tokens, seconds; 0: the server's [jwt_svid] ttl.
ALTER TABLE entries ADD COLUMN jwt_ttl_seconds INTEGER NOT NULL DEFAULT 0;
