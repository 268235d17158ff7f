use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::PlacementError;

/// Most shards (k + m) one stripe may have.
pub const MAX_SHARDS: usize = 32;

/// An erasure-coding profile: `k` data shards plus `m` parity shards; any `k` of the
/// `k + m` rebuild the stripe. Written and parsed as `"K+M"`, e.g. `"4+2"`; serialized
/// in that text form too, so configs read naturally and a bad value fails to load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct EcProfile {
    pub k: u8,
    pub m: u8,
}

impl EcProfile {
    /// A checked profile.
    pub fn new(k: u8, m: u8) -> Result<Self, PlacementError> {
        let profile = EcProfile { k, m };
        profile.validate()?;
        Ok(profile)
    }

    /// Refuses `k = 0` and more than [`MAX_SHARDS`] shards in all.
    pub fn validate(&self) -> Result<(), PlacementError> {
        let invalid = |problem: String| PlacementError::InvalidProfile {
            input: self.to_string(),
            problem,
        };
        if self.k == 0 {
            return Err(invalid("k (data shards) must be at least 1".into()));
        }
        if self.total() > MAX_SHARDS {
            return Err(invalid(format!(
                "k+m = {} shards, more than the {MAX_SHARDS} a stripe may have",
                self.total()
            )));
        }
        Ok(())
    }

    /// Shards per stripe, `k + m`.
    pub fn total(&self) -> usize {
        usize::from(self.k) + usize::from(self.m)
    }

    /// The fewest shards a stripe of this profile may be written with while fewer than
    /// `k + m` nodes take shards: `requested` (None: `k + 1`), held between `k + 1` and
    /// `k + m`. A stripe with just `k` shards would be lost with any one node more.
    pub fn min_write_shards(&self, requested: Option<u8>) -> usize {
        let (k, total) = (usize::from(self.k), self.total());
        requested
            .map_or(k + 1, usize::from)
            .clamp((k + 1).min(total), total)
    }
}

impl fmt::Display for EcProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}+{}", self.k, self.m)
    }
}

impl FromStr for EcProfile {
    type Err = PlacementError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = |problem: &str| PlacementError::InvalidProfile {
            input: s.to_owned(),
            problem: problem.to_owned(),
        };
        let (k, m) = s
            .split_once('+')
            .ok_or_else(|| invalid("expected K+M, e.g. \"4+2\""))?;
        let k = k
            .trim()
            .parse()
            .map_err(|_| invalid("k (data shards) is not a number from 1 to 32"))?;
        let m = m
            .trim()
            .parse()
            .map_err(|_| invalid("m (parity shards) is not a number from 0 to 31"))?;
        EcProfile::new(k, m)
    }
}

impl TryFrom<String> for EcProfile {
    type Error = PlacementError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<EcProfile> for String {
    fn from(p: EcProfile) -> String {
        p.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(s: &str) -> String {
        match s.parse::<EcProfile>() {
            Err(e) => e.to_string(),
            Ok(p) => panic!("{s:?} parsed as {p}"),
        }
    }

    #[test]
    fn degraded_writes_keep_at_least_one_spare_shard() {
        let p = EcProfile { k: 4, m: 2 };
        assert_eq!(p.min_write_shards(None), 5);
        assert_eq!(p.min_write_shards(Some(6)), 6);
        assert_eq!(p.min_write_shards(Some(3)), 5, "never below k+1");
        assert_eq!(p.min_write_shards(Some(9)), 6, "never above k+m");
        assert_eq!(EcProfile { k: 3, m: 0 }.min_write_shards(None), 3);
    }

    #[test]
    fn profile_parses_and_prints_k_plus_m() {
        assert_eq!("4+2".parse::<EcProfile>(), Ok(EcProfile { k: 4, m: 2 }));
        assert_eq!(" 8 + 3 ".parse::<EcProfile>(), Ok(EcProfile { k: 8, m: 3 }));
        assert_eq!("1+0".parse::<EcProfile>().map(|p| p.total()), Ok(1));
        assert_eq!(EcProfile { k: 4, m: 2 }.to_string(), "4+2");
    }

    #[test]
    fn profile_errors_name_the_problem() {
        assert!(problem("4-2").contains("expected K+M"));
        assert!(problem("x+2").contains("k (data shards) is not a number"));
        assert!(problem("4+").contains("m (parity shards) is not a number"));
        assert!(problem("0+2").contains("k (data shards) must be at least 1"));
        assert!(problem("30+3").contains("k+m = 33 shards"));
        assert!(problem("300+3").contains("\"300+3\""));
    }

    #[test]
    fn profile_serializes_as_text_and_checks_on_load() -> Result<(), serde_json::Error> {
        let p = EcProfile { k: 4, m: 2 };
        assert_eq!(serde_json::to_string(&p)?, "\"4+2\"");
        assert_eq!(serde_json::from_str::<EcProfile>("\"4+2\"")?, p);
        assert!(serde_json::from_str::<EcProfile>("\"0+1\"").is_err());
        Ok(())
    }

    #[test]
    fn profile_allows_up_to_thirty_two_shards() {
        assert!(EcProfile::new(16, 16).is_ok());
        assert!(EcProfile::new(32, 0).is_ok());
        assert!(EcProfile::new(17, 16).is_err());
        assert!(EcProfile::new(255, 255).is_err());
    }
}
