//! Per-source counters of things held at once (connections, requests in flight), so that one
//! source address (IPv6: one /64) cannot take every slot of a server-wide cap. Defined once in
//! [`signet_runtime::source`], which every listener of every binary uses.

pub use signet_runtime::source::{PerSource, SourceSlot};
