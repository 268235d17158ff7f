use shoal_ids::NodeId;

/// Everything the placement crate can refuse. Each message names the value at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// The layout has fewer active, non-zero-weight nodes than the stripe has shards.
    #[error(
        "not enough nodes: a stripe needs {need} distinct active nodes with non-zero weight, the layout has {have}"
    )]
    NotEnoughNodes { need: usize, have: usize },

    /// Two layout entries carry the same node id.
    #[error("node {0} appears more than once in the layout")]
    DuplicateNode(NodeId),

    /// An EC profile that cannot be used, with the reason.
    #[error("invalid EC profile {input:?}: {problem}")]
    InvalidProfile { input: String, problem: String },

    /// A maximum shard size that is zero or not a multiple of the shard alignment.
    #[error("invalid shard size {shard_size}: it must be a non-zero multiple of {align} bytes")]
    InvalidShardSize { shard_size: u64, align: u64 },

    /// A stripe longer than `k` shards of the maximum shard size can hold.
    #[error("stripe of {len} bytes is too long: at most {max} bytes (k x shard size) fit")]
    StripeTooLong { len: u64, max: u64 },

    /// A shard index that does not name a data shard (parity shards hold no stripe bytes).
    #[error("shard {index} is not a data shard: data shards are 0..{k}")]
    NotADataShard { index: u8, k: u8 },

    /// A read range that does not lie inside the stripe.
    #[error(
        "range at offset {offset} of {len} bytes lies outside the stripe of {stripe_len} bytes"
    )]
    RangeOutOfBounds {
        offset: u64,
        len: u64,
        stripe_len: u64,
    },
}

impl PlacementError {
    /// True when the same request may succeed under a later layout (more nodes joined or
    /// came back); every other variant is a caller or data error that no retry fixes.
    pub fn is_retryable(&self) -> bool {
        matches!(self, PlacementError::NotEnoughNodes { .. })
    }
}
