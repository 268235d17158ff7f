//! One store (bucket and prefix) belongs to one cluster: the first agent to use it writes
//! the cluster's identity there (a digest of its CA certificate), and an agent of another
//! cluster refuses it — otherwise each cluster's collector would delete the other's
//! objects as orphans. The mover, the collector and releases act only once the claim was
//! checked; an unreachable store at start only delays that.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;

use super::Tier;
use crate::AgentError;

/// The claim's key, under the store's prefix.
const CLAIM_KEY: &str = "cluster";
const CLAIM_TIMEOUT: Duration = Duration::from_secs(10);

/// The claim's contents for a cluster whose CA certificate is `ca_pem`.
pub(super) fn claim_text(ca_pem: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, ca_pem);
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("shoal cluster ca-sha256 {hex}\n")
}

impl Tier {
    /// Checks (or makes) the store's claim. A store claimed by another cluster is a
    /// configuration error naming it.
    pub async fn claim(&self) -> Result<(), AgentError> {
        if self.claimed.load(Ordering::Acquire) {
            return Ok(());
        }
        let want = self.claim.as_bytes();
        match self.read_claim().await? {
            Some(got) if &got[..] == want => {}
            Some(got) if is_claim(&got) => {
                return Err(AgentError::ConfigValue {
                    key: "tiering".into(),
                    reason: format!(
                        "{} belongs to another shoal cluster (its `{CLAIM_KEY}` object names \
                         another CA); give this cluster its own bucket or prefix",
                        self.store.describe()
                    ),
                });
            }
            // None, or not a whole claim (a put the store kept short): ours is written,
            // and read back, since the claim decides whose objects the collector may
            // delete.
            _ => {
                self.timed(
                    CLAIM_TIMEOUT,
                    self.store.put(CLAIM_KEY, Bytes::copy_from_slice(want)),
                )
                .await?;
                if self.read_claim().await?.as_deref() != Some(want) {
                    return Err(AgentError::NotYet(format!(
                        "{} did not keep this cluster's claim as written; trying again later",
                        self.store.describe()
                    )));
                }
            }
        }
        self.claimed.store(true, Ordering::Release);
        Ok(())
    }

    /// The claim object as the store holds it, whole; `None` when there is none.
    async fn read_claim(&self) -> Result<Option<Bytes>, AgentError> {
        match self
            .timed(CLAIM_TIMEOUT, self.store.size(CLAIM_KEY))
            .await?
        {
            Some(n) => Ok(Some(
                self.timed(CLAIM_TIMEOUT, self.store.get_range(CLAIM_KEY, 0..n))
                    .await?,
            )),
            None => Ok(None),
        }
    }
}

/// Whether `bytes` are a whole claim (of any cluster): `claim_text`'s shape.
fn is_claim(bytes: &[u8]) -> bool {
    let Some(hex) = std::str::from_utf8(bytes)
        .ok()
        .and_then(|t| t.strip_prefix("shoal cluster ca-sha256 "))
        .and_then(|t| t.strip_suffix('\n'))
    else {
        return false;
    };
    hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::{claim_text, is_claim};

    #[test]
    fn a_claim_names_the_ca_by_digest() {
        let a = claim_text(b"-----BEGIN CERTIFICATE-----\nA\n");
        assert!(a.starts_with("shoal cluster ca-sha256 "), "{a}");
        assert_eq!(a.len(), "shoal cluster ca-sha256 \n".len() + 64);
        assert_ne!(a, claim_text(b"-----BEGIN CERTIFICATE-----\nB\n"));
    }

    /// A claim the store kept short is no claim: the agent writes its own over it rather
    /// than refusing the bucket as another cluster's for good.
    #[test]
    fn only_a_whole_claim_names_a_cluster() {
        let a = claim_text(b"A");
        assert!(is_claim(a.as_bytes()));
        assert!(is_claim(claim_text(b"B").as_bytes()));
        assert!(!is_claim(&a.as_bytes()[..a.len() / 2]), "kept short");
        assert!(!is_claim(&a.as_bytes()[..a.len() - 1]), "no newline");
        assert!(!is_claim(b""));
        assert!(!is_claim(b"some other object\n"));
    }
}
