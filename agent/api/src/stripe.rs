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
