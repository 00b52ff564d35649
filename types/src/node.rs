//! Node identities: the ID an agent's node is known by and the SPIFFE ID it gets.
//!
//! Shared by the server's authentication (a join token or a node SVID names a node), its
//! registration entries (an entry's parent is a node) and renewal (an entry-sourced
//! certificate names its node). Invariant: a [`NodeId`] is always valid, 1–128 of
//! `[A-Za-z0-9._-]` and not `.` or `..`, so it is always one SPIFFE ID path segment, and
//! [`node_spiffe_id`] and [`node_id_of`] are each other's inverse.

use std::fmt;

use crate::untrusted::quoted;
use crate::{SpiffeId, SpiffeIdError, TrustDomain};

/// Node SPIFFE IDs live under this path: `spiffe://<td>/signet/node/<node-id>`.
pub const NODE_PATH_PREFIX: &str = "/signet/node/";

/// Longest node ID accepted.
pub const MAX_NODE_ID: usize = 128;

/// Why a string is not a node ID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NodeIdError {
    #[error("node ID must be 1 to {MAX_NODE_ID} characters, got {0}")]
    Length(usize),
    #[error("node ID {0:?} is not allowed")]
    Dot(&'static str),
    /// The input, quoted and cut short.
    #[error("node ID {0} may contain only letters, digits, '.', '_' and '-'")]
    Character(String),
    #[error("node ID {id} does not make a SPIFFE ID: {source}")]
    SpiffeId { id: String, source: SpiffeIdError },
}

/// A node ID: 1–128 of `[A-Za-z0-9._-]`, not `.` or `..`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(String);

impl NodeId {
    pub fn new(id: &str) -> Result<Self, NodeIdError> {
        if id.is_empty() || id.len() > MAX_NODE_ID {
            return Err(NodeIdError::Length(id.len()));
        }
        match id {
            "." => return Err(NodeIdError::Dot(".")),
            ".." => return Err(NodeIdError::Dot("..")),
            _ => {}
        }
        if !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return Err(NodeIdError::Character(quoted(id)));
        }
        Ok(Self(id.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The node's SPIFFE ID in `td`.
    pub fn spiffe_id(&self, td: &TrustDomain) -> Result<SpiffeId, NodeIdError> {
        td.id(&format!("{NODE_PATH_PREFIX}{}", self.0))
            .map_err(|source| NodeIdError::SpiffeId {
                id: quoted(&self.0),
                source,
            })
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeId({:?})", self.0)
    }
}

/// The SPIFFE ID of node `node_id` in `td`.
pub fn node_spiffe_id(td: &TrustDomain, node_id: &str) -> Result<SpiffeId, NodeIdError> {
    NodeId::new(node_id)?.spiffe_id(td)
}

/// The node ID of a node SPIFFE ID of `td`, if it is one.
pub fn node_id_of<'a>(id: &'a SpiffeId, td: &TrustDomain) -> Option<&'a str> {
    if !id.is_member_of(td) {
        return None;
    }
    let rest = id.path().strip_prefix(NODE_PATH_PREFIX)?;
    NodeId::new(rest).ok().map(|_| rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn td() -> TrustDomain {
        TrustDomain::new("example.org").expect("td")
    }

    #[test]
    fn node_id_errors_say_why() {
        assert_eq!(NodeId::new(""), Err(NodeIdError::Length(0)));
        assert_eq!(NodeId::new(&"x".repeat(129)), Err(NodeIdError::Length(129)));
        assert_eq!(NodeId::new(".."), Err(NodeIdError::Dot("..")));
        assert_eq!(
            NodeId::new("a\nb").expect_err("bad").to_string(),
            "node ID \"a\\nb\" may contain only letters, digits, '.', '_' and '-'"
        );
        let n = NodeId::new("node-1.example_A").expect("valid");
        assert_eq!(n.as_str(), "node-1.example_A");
        assert_eq!(format!("{n:?}"), "NodeId(\"node-1.example_A\")");
    }

    #[test]
    fn spiffe_ids_round_trip() {
        for n in ["n1", "a.b", "x_y-z"] {
            let id = node_spiffe_id(&td(), n).expect("id");
            assert_eq!(id.path(), format!("{NODE_PATH_PREFIX}{n}"));
            assert_eq!(node_id_of(&id, &td()), Some(n));
        }
        let deep: SpiffeId = "spiffe://example.org/signet/node/a/b".parse().expect("id");
        assert_eq!(node_id_of(&deep, &td()), None);
    }
}
