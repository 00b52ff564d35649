//! Sources and per-source counters: what one client address may hold at once (connections,
//! requests in flight), so that one source cannot take every slot of a listener-wide cap.
//!
//! A *source* is an IPv4 address (IPv4-mapped IPv6 too), or an IPv6 address's /64. One host,
//! one home or one cloud customer is handed a whole /64 (SLAAC and privacy addresses rotate
//! inside it), so counting IPv6 per address would let one attacker be 2^64 sources. The price:
//! clients that share a /64 (the pods of one node in an IPv6 cluster whose per-node pod CIDR is
//! a /64, clients behind one NAT64) share one budget, as clients behind one IPv4 NAT already
//! do. Every per-source limit in Signet (the gRPC listener, the HTTP listeners, the rate
//! limiters, the audit log's flood folding) uses this one key.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex, PoisonError};

/// The key of a source address: IPv4 as is (IPv4-mapped IPv6 too), IPv6 by its /64.
pub fn source_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

/// How many of something each source holds now, with a per-source maximum. Only sources that
/// hold something are remembered, so the table is never larger than what is held (which the
/// caller bounds with its own listener-wide cap).
#[derive(Debug)]
pub struct PerSource {
    max: usize,
    held: Mutex<HashMap<IpAddr, usize>>,
}

/// One unit held by a source; released on drop.
#[derive(Debug)]
pub struct SourceSlot {
    owner: Arc<PerSource>,
    key: IpAddr,
}

impl PerSource {
    /// At most `max` (at least 1) per source.
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max: max.max(1),
            held: Mutex::new(HashMap::new()),
        })
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// Takes one unit for `ip`'s source, unless it already holds `max`.
    pub fn try_take(self: &Arc<Self>, ip: IpAddr) -> Option<SourceSlot> {
        let key = source_key(ip);
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let n = held.entry(key).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(SourceSlot {
            owner: self.clone(),
            key,
        })
    }

    /// Units `ip`'s source holds now.
    pub fn held(&self, ip: IpAddr) -> usize {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.get(&source_key(ip)).copied().unwrap_or(0)
    }

    /// Sources holding at least one unit now.
    pub fn sources(&self) -> usize {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut held = self
            .owner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = held.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_is_itself_and_ipv6_is_its_64() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::2".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(source_key(a), source_key(b));
        assert_ne!(source_key(a), source_key(c));
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(source_key(mapped), "192.0.2.7".parse::<IpAddr>().unwrap());
        let v4: IpAddr = "192.0.2.7".parse().unwrap();
        assert_eq!(source_key(v4), v4);
    }

    #[test]
    fn each_source_holds_at_most_max_and_gets_its_slots_back() {
        let p = PerSource::new(2);
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let s1 = p.try_take(a).unwrap();
        let _s2 = p.try_take(a).unwrap();
        assert!(p.try_take(a).is_none());
        let _t = p.try_take(b).unwrap();
        drop(s1);
        assert_eq!(p.held(a), 1);
        let _s3 = p.try_take(a).unwrap();
        // One /64 is one source.
        let v1: IpAddr = "2001:db8::1".parse().unwrap();
        let v2: IpAddr = "2001:db8::2".parse().unwrap();
        let _u1 = p.try_take(v1).unwrap();
        let _u2 = p.try_take(v2).unwrap();
        assert!(p.try_take(v1).is_none());
    }

    #[test]
    fn released_sources_are_forgotten() {
        let p = PerSource::new(1);
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        drop(p.try_take(a).unwrap());
        assert_eq!(p.sources(), 0);
        assert!(p.held.lock().unwrap().is_empty());
    }
}
