use serde::{Deserialize, Serialize};
use shoal_placement::{EcProfile, NodeId, StripeId};

/// Where one shard of a stripe is, and its checksum.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardLocation {
    pub index: u8,
    pub node: NodeId,
    pub crc32c: u32,
}

/// What a client needs to read a stripe back (until the metadata service keeps these).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StripeRecord {
    pub id: StripeId,
    /// Bytes of data in the stripe.
    pub len: u64,
    pub ec: EcProfile,
    pub shard_len: u64,
    /// Layout epoch the shards were placed under.
    pub epoch: u64,
    /// The actual location of every shard, data shards first.
    pub shards: Vec<ShardLocation>,
}

/// Why a stripe record cannot be read as it says.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// Its erasure-coding profile is not one a stripe can have.
    #[error("stripe {stripe}: {source}")]
    Profile {
        stripe: StripeId,
        source: shoal_placement::PlacementError,
    },
    /// It lists another number of shard locations than its profile has shards.
    #[error("stripe {stripe} has {have} shard locations for {ec}")]
    ShardCount {
        stripe: StripeId,
        have: usize,
        ec: EcProfile,
    },
    /// A location names another shard than its slot.
    #[error("stripe {stripe}: slot {slot} holds shard index {index}")]
    Slot {
        stripe: StripeId,
        slot: usize,
        index: u8,
    },
    /// Its shards are too short for its length.
    #[error("stripe {stripe}: {k} shards of {shard_len} bytes cannot hold {len} bytes")]
    TooShort {
        stripe: StripeId,
        k: u8,
        shard_len: u64,
        len: u64,
    },
}

impl StripeRecord {
    /// Checks that the record can be read as it says: a valid profile, exactly one shard
    /// per slot in slot order, and a shard length that holds the data. A record from the
    /// network or disk that fails this is refused, never indexed out of range.
    pub fn check(&self) -> Result<(), RecordError> {
        let stripe = self.id;
        self.ec
            .validate()
            .map_err(|source| RecordError::Profile { stripe, source })?;
        if self.shards.len() != self.ec.total() {
            return Err(RecordError::ShardCount {
                stripe,
                have: self.shards.len(),
                ec: self.ec,
            });
        }
        if let Some((slot, s)) = self
            .shards
            .iter()
            .enumerate()
            .find(|(slot, s)| usize::from(s.index) != *slot)
        {
            return Err(RecordError::Slot {
                stripe,
                slot,
                index: s.index,
            });
        }
        if self.shard_len.saturating_mul(u64::from(self.ec.k)) < self.len {
            return Err(RecordError::TooShort {
                stripe,
                k: self.ec.k,
                shard_len: self.shard_len,
                len: self.len,
            });
        }
        Ok(())
    }
}

/// The answer to a stripe read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StripeRead {
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
    /// True when shards had to be decoded (a data shard was missing, slow or corrupt).
    pub decoded: bool,
    /// Shard indexes that could not be used.
    pub bad_shards: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> StripeRecord {
        StripeRecord {
            id: StripeId(1),
            len: 100,
            ec: EcProfile { k: 2, m: 1 },
            shard_len: 50,
            epoch: 1,
            shards: (0..3)
                .map(|index| ShardLocation {
                    index,
                    node: NodeId(u64::from(index) + 1),
                    crc32c: 0,
                })
                .collect(),
        }
    }

    #[test]
    fn records_that_cannot_be_read_as_they_say_are_refused() {
        assert_eq!(record().check(), Ok(()));
        let mut out_of_range = record();
        out_of_range.shards[2].index = 200;
        assert!(out_of_range.check().is_err());
        let mut swapped = record();
        swapped.shards.swap(0, 1);
        assert!(swapped.check().is_err());
        let mut short = record();
        short.shards.pop();
        assert!(short.check().is_err());
        let mut small = record();
        small.shard_len = 49;
        assert!(small.check().is_err());
        let mut bad_ec = record();
        bad_ec.ec.k = 0;
        assert!(bad_ec.check().is_err());
    }
}
