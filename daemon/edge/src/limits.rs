//! Connection counts of one listener, across every worker: in total and per client address.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{
        atomic::{AtomicUsize, Ordering::Relaxed},
        Arc, Mutex,
    },
};

#[derive(Debug)]
pub struct ConnectionLimits {
    max: usize,
    max_per_ip: usize,
    open: AtomicUsize,
    per_ip: Mutex<HashMap<IpAddr, usize>>,
}

/// A connection counted against the listener's limits until it is dropped.
#[derive(Debug)]
pub struct Admitted {
    limits: Arc<ConnectionLimits>,
    ip: Option<IpAddr>,
}

impl ConnectionLimits {
    /// A limit of 0 is none.
    pub fn new(max: usize, max_per_ip: usize) -> Arc<Self> {
        Arc::new(Self {
            max,
            max_per_ip,
            open: AtomicUsize::new(0),
            per_ip: Mutex::default(),
        })
    }

    /// Counts a new connection against the listener's total; `None` when that is full.
    pub fn admit(self: &Arc<Self>) -> Option<Admitted> {
        let open = self.open.fetch_add(1, Relaxed);
        let admitted = Admitted {
            limits: self.clone(),
            ip: None,
        };
        (self.max == 0 || open < self.max).then_some(admitted)
    }

    /// Counts the connection against its client's share too (the address a PROXY header names, when there
    /// is one); `false` when that is full. The connection stays counted until dropped either way.
    pub fn admit_client(&self, admitted: &mut Admitted, ip: IpAddr) -> bool {
        if self.max_per_ip == 0 {
            return true;
        }
        let mut per_ip = self.per_ip.lock().expect("connection table");
        let open = per_ip.entry(ip).or_default();
        *open += 1;
        admitted.ip = Some(ip);
        *open <= self.max_per_ip
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.limits.open.fetch_sub(1, Relaxed);
        if let Some(ip) = self.ip {
            let mut per_ip = self.limits.per_ip.lock().expect("connection table");
            if let Some(open) = per_ip.get_mut(&ip) {
                *open -= 1;
                if *open == 0 {
                    per_ip.remove(&ip);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_and_per_client_shares_are_released_on_drop() {
        let limits = ConnectionLimits::new(3, 2);
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let mut c1 = limits.admit().unwrap();
        assert!(limits.admit_client(&mut c1, a));
        let mut c2 = limits.admit().unwrap();
        assert!(limits.admit_client(&mut c2, a));
        let mut c3 = limits.admit().unwrap();
        assert!(
            !limits.admit_client(&mut c3, a),
            "a third from the same client"
        );
        assert!(limits.admit().is_none(), "a fourth in total");
        assert_eq!(limits.open.load(Relaxed), 3);
        drop(c3);
        let mut c4 = limits.admit().unwrap();
        assert!(limits.admit_client(&mut c4, b));
        drop((c1, c2, c4));
        assert_eq!(limits.open.load(Relaxed), 0);
        assert!(limits.per_ip.lock().unwrap().is_empty());
        let unlimited = ConnectionLimits::new(0, 0);
        let many: Vec<_> = (0..1000).map(|_| unlimited.admit().unwrap()).collect();
        assert_eq!(unlimited.open.load(Relaxed), many.len());
    }
}
