//! What goes cold (pure; time is passed in). A file is eligible once it has not been read
//! or written for `cold_after`; while the nodes' NVMe fill is above the high watermark the
//! least recently used files go too, whatever their age, until the low watermark would be
//! reached. Pinned paths never go.

/// The tiering policy's settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Policy {
    /// Not used for this long (ms) → eligible; None: age alone never makes data cold.
    pub cold_after_ms: Option<u64>,
    /// Shares of capacity (0..=1): above `high`, evict until `low`.
    pub high_watermark: f64,
    pub low_watermark: f64,
}

/// A file with data on NVMe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub ino: u64,
    /// When it was last read or written (ms, the same clock as `now_ms`).
    pub last_used_ms: u64,
    /// What its hot data takes on NVMe (all shards).
    pub stored_bytes: u64,
    pub pinned: bool,
}

/// Why a file was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Unused for `cold_after`.
    Cold,
    /// The fill is above the high watermark and it was among the least recently used.
    Pressure,
}

/// The NVMe fill of the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fill {
    pub used: u64,
    pub capacity: u64,
}

impl Fill {
    /// Share used, 0 for no capacity.
    pub fn share(&self) -> f64 {
        if self.capacity == 0 {
            0.0
        } else {
            self.used as f64 / self.capacity as f64
        }
    }
}

/// The files to move, in the order to move them: cold ones (oldest first), then what
/// pressure needs (least recently used first).
pub fn choose(policy: &Policy, now_ms: u64, fill: Fill, files: &[Candidate]) -> Vec<(u64, Reason)> {
    let mut order: Vec<&Candidate> = files.iter().filter(|c| !c.pinned).collect();
    order.sort_by_key(|c| (c.last_used_ms, c.ino));
    let mut out = Vec::new();
    let mut freed = 0u64;
    let mut taken = std::collections::HashSet::new();
    if let Some(after) = policy.cold_after_ms {
        for c in &order {
            if now_ms.saturating_sub(c.last_used_ms) >= after {
                out.push((c.ino, Reason::Cold));
                freed = freed.saturating_add(c.stored_bytes);
                taken.insert(c.ino);
            }
        }
    }
    if fill.share() > policy.high_watermark {
        let target = (fill.capacity as f64 * policy.low_watermark) as u64;
        for c in &order {
            if fill.used.saturating_sub(freed) <= target {
                break;
            }
            if taken.insert(c.ino) {
                out.push((c.ino, Reason::Pressure));
                freed = freed.saturating_add(c.stored_bytes);
            }
        }
    }
    out
}

/// True when `path` is one of `pins` or below one (whole path components: a pin of
/// `/data/a` does not cover `/data/ab`).
pub fn is_pinned(path: &str, pins: &[String]) -> bool {
    pins.iter().any(|p| {
        let p = p.trim_end_matches('/');
        p.is_empty()
            || path == p
            || path
                .strip_prefix(p)
                .is_some_and(|rest| rest.starts_with('/'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(ino: u64, last_used_ms: u64, stored_bytes: u64) -> Candidate {
        Candidate {
            ino,
            last_used_ms,
            stored_bytes,
            pinned: false,
        }
    }

    const POLICY: Policy = Policy {
        cold_after_ms: Some(1_000),
        high_watermark: 0.8,
        low_watermark: 0.6,
    };
    const ROOMY: Fill = Fill {
        used: 10,
        capacity: 100,
    };

    #[test]
    fn files_unused_for_cold_after_go_oldest_first() {
        let files = [file(1, 5_000, 10), file(2, 1_000, 10), file(3, 5_500, 10)];
        let chosen = choose(&POLICY, 6_000, ROOMY, &files);
        assert_eq!(chosen, vec![(2, Reason::Cold), (1, Reason::Cold)]);
        assert!(choose(&POLICY, 1_999, ROOMY, &files).is_empty());
        let never = Policy {
            cold_after_ms: None,
            ..POLICY
        };
        assert!(choose(&never, u64::MAX, ROOMY, &files).is_empty());
    }

    #[test]
    fn above_the_high_watermark_the_least_recently_used_go_until_the_low_one() {
        let full = Fill {
            used: 90,
            capacity: 100,
        };
        // Nothing is old enough; 30 must go to get from 90 to 60.
        let files = [
            file(1, 900, 20),
            file(2, 100, 20),
            file(3, 500, 20),
            file(4, 950, 20),
        ];
        let chosen = choose(&POLICY, 1_000, full, &files);
        assert_eq!(chosen, vec![(2, Reason::Pressure), (3, Reason::Pressure)]);
        // Cold files count towards what pressure needs.
        let chosen = choose(&POLICY, 1_150, full, &files);
        assert_eq!(chosen, vec![(2, Reason::Cold), (3, Reason::Pressure)]);
        // At or below the high mark, pressure takes nothing.
        let at_high = Fill {
            used: 80,
            capacity: 100,
        };
        assert!(choose(&POLICY, 1_000, at_high, &files).is_empty());
    }

    #[test]
    fn pinned_files_never_go() {
        let mut pinned = file(1, 0, 50);
        pinned.pinned = true;
        let full = Fill {
            used: 99,
            capacity: 100,
        };
        let chosen = choose(&POLICY, 10_000, full, &[pinned, file(2, 5, 10)]);
        assert_eq!(chosen, vec![(2, Reason::Cold)]);
    }

    #[test]
    fn pins_cover_whole_path_components() {
        let pins = vec!["/data/a".to_owned(), "/ckpt/".to_owned()];
        assert!(is_pinned("/data/a", &pins));
        assert!(is_pinned("/data/a/x/y", &pins));
        assert!(!is_pinned("/data/ab", &pins));
        assert!(is_pinned("/ckpt/latest", &pins));
        assert!(!is_pinned("/other", &pins));
        assert!(is_pinned("/anything", &["/".to_owned()]));
    }
}
