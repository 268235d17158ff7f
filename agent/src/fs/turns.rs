//! Copies of one request take turns: a request the mount sent again (its connection broke)
//! while the first copy is still being answered waits for it, and then finds the first's
//! answer remembered, instead of being answered a second time beside it (a leased stripe
//! write takes milliseconds; two copies would write the data twice, and the later one
//! could land after a write the mount sent once the first copy was answered).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedMutexGuard;

/// One lock per key being served, made on demand and dropped with its last turn.
pub struct Turns<K> {
    serving: Mutex<HashMap<K, Arc<tokio::sync::Mutex<()>>>>,
}

impl<K> Default for Turns<K> {
    fn default() -> Self {
        Turns {
            serving: Mutex::new(HashMap::new()),
        }
    }
}

/// The turn of one copy of `key`: the next copy goes when it is dropped.
pub struct Turn<'a, K: Eq + Hash + Copy> {
    turns: &'a Turns<K>,
    key: K,
    guard: OwnedMutexGuard<()>,
}

impl<K: Eq + Hash + Copy> Turns<K> {
    fn serving(&self) -> std::sync::MutexGuard<'_, HashMap<K, Arc<tokio::sync::Mutex<()>>>> {
        self.serving.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until no other copy of `key` is being served.
    pub async fn take(&self, key: K) -> Turn<'_, K> {
        let lock = self.serving().entry(key).or_default().clone();
        Turn {
            turns: self,
            key,
            guard: lock.lock_owned().await,
        }
    }

    /// Keys with a turn taken or waited for.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.serving().len()
    }
}

impl<K: Eq + Hash + Copy> Drop for Turn<'_, K> {
    fn drop(&mut self) {
        let mut serving = self.turns.serving();
        // The map's and this turn's: no other copy waits (a copy takes its clone under
        // the same map lock). The guard goes after.
        if Arc::strong_count(OwnedMutexGuard::mutex(&self.guard)) == 2 {
            serving.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_second_copy_waits_for_the_first_and_other_keys_do_not() {
        let turns = Arc::new(Turns::<u64>::default());
        let first = turns.take(1).await;
        let waiting = tokio::spawn({
            let turns = turns.clone();
            async move {
                let _t = turns.take(1).await;
            }
        });
        let other = tokio::time::timeout(Duration::from_secs(5), turns.take(2)).await;
        assert!(other.is_ok(), "another key goes at once");
        drop(other);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "the copy waits for the first");
        drop(first);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the copy goes once the first is done")
            .expect("join");
        assert_eq!(turns.len(), 0, "nothing left behind");
    }
}
