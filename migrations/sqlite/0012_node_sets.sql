-- Node sets and entries owned by a registrar (issue 29).
--
-- A node records the selectors its attestation proved (JSON array of strings, e.g.
-- "signet:attestation:k8s_psat", "k8s_psat:cluster:prod", "k8s_psat:node_name:worker-1").
-- Nodes attested before this migration get only their attestation method; a node's full set
-- is written at its next attestation.
ALTER TABLE nodes ADD COLUMN selectors TEXT NOT NULL DEFAULT '[]';
UPDATE nodes SET selectors = '["signet:attestation:' || attestation || '"]';

-- A named set of nodes: every node whose selectors include all of the set's. An entry whose
-- parent_id is spiffe://<td>/signet/nodeset/<name> is served to every member.
CREATE TABLE node_sets (
    name       TEXT PRIMARY KEY NOT NULL,
    selectors  TEXT NOT NULL,   -- JSON array of strings, sorted, at least one
    created_at BIGINT NOT NULL
);

-- Who made an entry: '' (the operator, through the admin socket) or the SPIFFE ID of the
-- registrar (the Kubernetes bridge) that keeps it, with the registrar's name for the object it
-- came from. A registrar only ever changes or deletes its own entries.
ALTER TABLE entries ADD COLUMN owner TEXT NOT NULL DEFAULT '';
ALTER TABLE entries ADD COLUMN owner_scope TEXT NOT NULL DEFAULT '';
CREATE INDEX entries_owner ON entries (owner, owner_scope);
