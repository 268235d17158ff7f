//! A cluster on paper: a layout of equal nodes in racks, and stripes of the default
//! profile placed on it by the real placement function.

use shoal_agent::StorageConfig;
use shoal_agent_api::{ShardLocation, StripeRecord};
use shoal_disk::SplitMix64;
use shoal_placement::{
    DEFAULT_SHARD_SIZE, EcProfile, FailureDomain, Layout, LayoutNode, NodeId, NodeState,
    PlacementError, StripeId, place,
};

/// Nodes per rack (failure domain), as a rack of servers.
const NODES_PER_RACK: usize = 20;
/// Stripes per node: enough for hundreds of shards on each.
pub const STRIPES_PER_NODE: usize = 100;
/// Every node's weight (its capacity in bytes): all equal.
const WEIGHT: u64 = 1 << 40;

/// The layout and every stripe placed on it.
pub struct Cluster {
    pub layout: Layout,
    pub racks: usize,
    pub profile: EcProfile,
    pub records: Vec<StripeRecord>,
}

impl Cluster {
    /// `nodes` active nodes with seeded random ids in `nodes / 20` racks (at least two
    /// per shard of a stripe, so every stripe spreads over distinct racks), and
    /// [`STRIPES_PER_NODE`] stripes per node of the agent's default profile.
    pub fn build(nodes: usize, seed: u64) -> Result<Cluster, PlacementError> {
        let profile = StorageConfig::default().ec;
        if nodes < profile.total() {
            let need = profile.total();
            return Err(PlacementError::NotEnoughNodes { need, have: nodes });
        }
        let racks = (nodes / NODES_PER_RACK).max(2 * profile.total()).min(nodes);
        let mut rng = SplitMix64(seed ^ 0x5ca1_e000);
        let members = (0..nodes)
            .map(|i| LayoutNode::active(random_node(&mut rng), rack(i % racks), WEIGHT))
            .collect();
        let layout = Layout::new(1, members)?;
        let records = (0..nodes * STRIPES_PER_NODE)
            .map(|_| {
                let id = StripeId(u128::from(rng.next_u64()) << 64 | u128::from(rng.next_u64()));
                let targets = place(&layout, id, profile)?;
                Ok(record(id, profile, &targets))
            })
            .collect::<Result<_, PlacementError>>()?;
        Ok(Cluster {
            layout,
            racks,
            profile,
            records,
        })
    }

    /// Shards in all.
    pub fn shards(&self) -> u64 {
        (self.records.len() * self.profile.total()) as u64
    }

    /// The layout with `node` in state `state`.
    pub fn with_state(&self, node: NodeId, state: NodeState) -> Result<Layout, PlacementError> {
        self.layout.with_state(node, state, self.layout.epoch() + 1)
    }

    /// The layout with one more active node, in rack `rack_index`.
    pub fn with_new_node(&self, node: NodeId, rack_index: usize) -> Result<Layout, PlacementError> {
        let mut nodes = self.layout.nodes().to_vec();
        nodes.push(LayoutNode::active(node, rack(rack_index), WEIGHT));
        Layout::new(self.layout.epoch() + 1, nodes)
    }
}

/// A random node id that is not [`NodeId::NONE`].
pub fn random_node(rng: &mut SplitMix64) -> NodeId {
    NodeId(rng.next_u64().max(1))
}

fn rack(i: usize) -> FailureDomain {
    FailureDomain(format!("rack{i:03}"))
}

fn record(id: StripeId, ec: EcProfile, targets: &[NodeId]) -> StripeRecord {
    StripeRecord {
        id,
        len: u64::from(ec.k) * DEFAULT_SHARD_SIZE,
        ec,
        shard_len: DEFAULT_SHARD_SIZE,
        epoch: 1,
        shards: targets
            .iter()
            .enumerate()
            .map(|(i, &node)| ShardLocation {
                index: i as u8,
                node,
                crc32c: 0,
            })
            .collect(),
    }
}
