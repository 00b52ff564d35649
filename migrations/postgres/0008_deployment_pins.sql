-- What every server sharing this database must agree on (server/src/server/pins.rs says which
-- values and why): one row per pinned value, written once (the first server to start on an
-- empty database pins its configuration; on a database from before this table, the first
-- server to start derives each value from what the database holds) and compared with each
-- server's configuration at start-up, before it signs or serves anything.
CREATE TABLE deployment_pins (
    name      TEXT PRIMARY KEY,
    value     TEXT NOT NULL,
    pinned_at BIGINT NOT NULL,  -- unix seconds
    source    TEXT NOT NULL     -- 'configuration' or 'derived' (from an older database's rows)
);
