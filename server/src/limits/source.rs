//! Per-source counters of things held at once (connections, requests in flight), so that one
//! source address (IPv6: one /64) cannot take every slot of a server-wide cap.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

use super::rate::source_key;

/// How many of something each source holds now, with a per-source maximum.
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
    #[cfg(test)]
    pub fn held(&self, ip: IpAddr) -> usize {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.get(&source_key(ip)).copied().unwrap_or(0)
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
        assert!(p.held.lock().unwrap().is_empty());
    }
}
