-- CA key slots (server/src/ca/manager.rs): every CA key is a root or an intermediate, in a
-- state prepared -> active -> retired -> removed, possibly tainted. Rows written before this
-- migration are the single generated root that signed leaves directly: it becomes the active
-- root (it keeps signing, now only intermediates) and stays trusted while its leaves live.
ALTER TABLE ca_keys ADD COLUMN kind TEXT NOT NULL DEFAULT 'root';
ALTER TABLE ca_keys ADD COLUMN parent_id TEXT NULL;
ALTER TABLE ca_keys ADD COLUMN activated_at INTEGER NULL;
ALTER TABLE ca_keys ADD COLUMN retired_at INTEGER NULL;
ALTER TABLE ca_keys ADD COLUMN removed_at INTEGER NULL;
ALTER TABLE ca_keys ADD COLUMN tainted_at INTEGER NULL;
UPDATE ca_keys SET activated_at = created_at WHERE state = 'active';

-- One row whose generation every slot change moves, in the same transaction (under its row
-- lock): a replica applies a transition only when nothing changed since it read the slots,
-- so each transition happens once across replicas.
CREATE TABLE ca_generation (
    id  INTEGER PRIMARY KEY CHECK (id = 1),
    gen INTEGER NOT NULL
);
INSERT INTO ca_generation (id, gen) VALUES (1, 0);

-- How many unexpired certificates each CA key issued (retirement and removal ask the ledger).
CREATE INDEX certificates_ca_key_not_after ON certificates (ca_key_id, not_after);
