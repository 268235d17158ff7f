//! The shards this node is giving up: between proposing to disown a copy (see
//! `workers/gc.rs`) and deleting it, a put of the same shard is refused. A relocation the
//! metadata accepts after the fence (`Command::RelocateShardsPlanned`) stores its shard
//! here only after the fence committed; refused until the old copy is deleted, it can
//! never be the copy that delete takes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use shoal_placement::StripeId;

/// Shards (stripe, index) being disowned, each with how many disowners hold it.
#[derive(Debug, Default)]
pub struct Disowning {
    held: Mutex<BTreeMap<(u128, u8), u32>>,
}

/// Puts of its shards are refused until it drops.
#[derive(Debug)]
pub struct DisowningGuard {
    set: Arc<Disowning>,
    shards: Vec<(u128, u8)>,
}

impl Disowning {
    fn held(&self) -> std::sync::MutexGuard<'_, BTreeMap<(u128, u8), u32>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Refuses puts of `shards` until the guard drops.
    pub fn hold(self: &Arc<Self>, shards: &[(StripeId, u8)]) -> DisowningGuard {
        let shards: Vec<(u128, u8)> = shards.iter().map(|(s, i)| (s.0, *i)).collect();
        let mut held = self.held();
        for key in &shards {
            *held.entry(*key).or_default() += 1;
        }
        DisowningGuard {
            set: self.clone(),
            shards,
        }
    }

    /// Whether a put of this shard must be refused now.
    pub fn refuses(&self, stripe: u128, index: u8) -> bool {
        self.held().contains_key(&(stripe, index))
    }
}

impl Drop for DisowningGuard {
    fn drop(&mut self) {
        let mut held = self.set.held();
        for key in &self.shards {
            if let Some(n) = held.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    held.remove(key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_is_refused_while_any_guard_holds_it() {
        let set = Arc::new(Disowning::default());
        let a = set.hold(&[(StripeId(1), 0), (StripeId(2), 3)]);
        let b = set.hold(&[(StripeId(1), 0)]);
        assert!(set.refuses(1, 0) && set.refuses(2, 3));
        assert!(!set.refuses(1, 1), "another slot of the stripe is not held");
        drop(a);
        assert!(set.refuses(1, 0), "still held by the second guard");
        assert!(!set.refuses(2, 3));
        drop(b);
        assert!(!set.refuses(1, 0));
    }
}
