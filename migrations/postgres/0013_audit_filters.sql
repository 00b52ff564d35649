-- Filtered audit listings (issue 30): `signetctl audit list --kind/--caller/--since` page by
-- id within one kind or one caller, and bound a time range, without reading the whole table.
CREATE INDEX audit_events_kind ON audit_events (kind, id);
CREATE INDEX audit_events_caller ON audit_events (caller, id);
CREATE INDEX audit_events_at ON audit_events (at);
-- Listing a node's join tokens (`signetctl token list --node-id`, and deleting a node's unused
-- tokens with it).
CREATE INDEX join_tokens_node ON join_tokens (node_id);
