-- Federation: the foreign trust domains whose bundles this deployment fetches and hands to
-- the agents whose entries federate with them (server/src/federation/), and the sequence of
-- the own bundle endpoint's document, shared by every replica.
CREATE TABLE federation_relationships (
    trust_domain         TEXT PRIMARY KEY NOT NULL,
    endpoint_url         TEXT NOT NULL,         -- '' for a static relationship
    profile              TEXT NOT NULL,         -- https_spiffe, https_web or static
    endpoint_spiffe_id   TEXT NOT NULL,         -- https_spiffe only
    created_at           BIGINT NOT NULL,
    bundle_document      TEXT NOT NULL,         -- the SPIFFE bundle document held; '' none yet
    bundle_sha256        TEXT NOT NULL,         -- hex SHA-256 of the document held; '' none
    bundle_sequence      BIGINT,                  -- its spiffe_sequence; NULL: none
    bundle_updated_at    BIGINT NOT NULL,
    last_success_at      BIGINT NOT NULL,
    last_attempt_at      BIGINT NOT NULL,
    next_refresh_at      BIGINT NOT NULL,         -- also the fetch claim: see store/federation.rs
    last_error           TEXT NOT NULL,
    consecutive_failures BIGINT NOT NULL
);

-- Which entries federate with which trust domain (the entries' own list is entries.federates_with).
CREATE TABLE entry_federates_with (
    trust_domain TEXT NOT NULL,
    entry_id     TEXT NOT NULL,
    PRIMARY KEY (trust_domain, entry_id)
);
CREATE INDEX entry_federates_with_entry ON entry_federates_with (entry_id);

-- JSON array of trust domain names, sorted.
ALTER TABLE entries ADD COLUMN federates_with TEXT NOT NULL DEFAULT '[]';

-- The own bundle endpoint's spiffe_sequence: one row, beside the hash of the keys it was given
-- to, the CA slot generation they came from (NULL: a plugged-in CA, whose generations are each
-- replica's own) and the document itself, which a replica behind that generation serves.
CREATE TABLE bundle_endpoint_sequence (
    id             BIGINT PRIMARY KEY NOT NULL CHECK (id = 1),
    sequence       BIGINT NOT NULL,
    content_sha256 TEXT NOT NULL,
    generation     BIGINT,
    document       TEXT NOT NULL
);
INSERT INTO bundle_endpoint_sequence (id, sequence, content_sha256, generation, document)
    VALUES (1, 0, '', NULL, '');
