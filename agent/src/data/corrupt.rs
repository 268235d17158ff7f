//! Shards of this node's store that a read found corrupt: reported by the shard server,
//! taken by the `scrub` worker, which gives them up so repair rewrites them.

use std::collections::BTreeSet;
use std::sync::Mutex;

use shoal_store::ShardKey;
use tokio::sync::Notify;

#[derive(Default)]
pub struct CorruptReports {
    keys: Mutex<BTreeSet<ShardKey>>,
    notify: Notify,
}

impl CorruptReports {
    pub fn report(&self, key: ShardKey) {
        self.lock().insert(key);
        self.notify.notify_one();
    }

    /// Every shard reported since the last call.
    pub fn take(&self) -> Vec<ShardKey> {
        std::mem::take(&mut *self.lock()).into_iter().collect()
    }

    /// Resolves when a shard is reported (at once if one was since the last `take`).
    pub async fn reported(&self) {
        self.notify.notified().await;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<ShardKey>> {
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_report_wakes_the_taker_once_per_shard() {
        let r = CorruptReports::default();
        let key = ShardKey {
            stripe: 7,
            index: 1,
        };
        r.report(key);
        r.report(key);
        tokio::time::timeout(std::time::Duration::from_secs(1), r.reported())
            .await
            .expect("woken");
        assert_eq!(r.take(), vec![key]);
        assert!(r.take().is_empty());
    }
}
