//! [`Audit`]: what the nodes' shard stores hold against what the metadata says they
//! should: shards a live stripe is missing on the nodes that run, shards no stripe names
//! (orphans), shards that no longer read back or match their record's checksum (damaged), freed
//! stripes whose shards were not deleted yet, and inodes with no name left that were not
//! purged; with a cold tier, also what the bucket holds against what
//! the metadata says it should: cold stripes whose object is missing or short, objects the
//! metadata does not know (an upload whose commit was lost) and objects no stripe uses
//! that were not deleted. With the faults healed, all of these must come to nothing:
//! redundancy is full again and nothing is left behind.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use shoal_agent::consensus::Group;
use shoal_placement::{NodeId, StripeId};
use shoal_store::{NodeStore, ShardKey, ShardStore, StoreError};

/// One look at the cluster's shards.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Audit {
    /// Live stripes' shards not on a running node that holds them: (stripe, index, node).
    pub missing: Vec<(StripeId, u8, NodeId)>,
    /// Shards a running node holds that no stripe names there: (node, shard).
    pub orphans: Vec<(u64, ShardKey)>,
    /// Shards a live stripe names on a running node that fail to read there or do not
    /// match the record's checksum: (node, shard).
    pub damaged: Vec<(u64, ShardKey)>,
    /// Stripes freed (no extent names them) whose shards wait to be deleted.
    pub garbage: usize,
    /// Inodes with no name left (unlinked), not purged yet.
    pub orphan_inodes: usize,
    /// Live stripes.
    pub stripes: usize,
    /// The first stripe with shards missing, slot by slot: "index@node" and whether a
    /// running node holds it.
    pub first_missing: Option<String>,
    /// The layout's nodes and their states.
    pub layout: String,
    /// Cold stripes whose object is not in the bucket, or too short for their range.
    pub cold_missing: Vec<StripeId>,
    /// Objects in the bucket the metadata does not know.
    pub stray_objects: usize,
    /// Objects no stripe uses, not deleted from the bucket yet.
    pub garbage_objects: usize,
    /// Live cold stripes.
    pub cold_stripes: usize,
}

impl Audit {
    pub fn clean(&self) -> bool {
        self.missing.is_empty()
            && self.orphans.is_empty()
            && self.damaged.is_empty()
            && self.garbage == 0
            && self.orphan_inodes == 0
            && self.cold_missing.is_empty()
            && self.stray_objects == 0
            && self.garbage_objects == 0
    }

    /// What is wrong, in a line (a few examples of each).
    pub fn describe(&self) -> String {
        let few = |v: Vec<String>| -> String {
            let more = if v.len() > 4 { " …" } else { "" };
            format!(
                "{}{more}",
                v.into_iter().take(4).collect::<Vec<_>>().join(", ")
            )
        };
        format!(
            "{} of {} stripes' shards missing ({}); {} orphan shards ({}); {} damaged shards ({}); {} freed stripes not deleted; {} unlinked inodes not purged; first stripe missing shards: {}; layout: {}; {} of {} cold stripes' objects missing or short ({}); {} objects the metadata does not know; {} garbage objects not deleted",
            self.missing.len(),
            self.stripes,
            few(self
                .missing
                .iter()
                .map(|(s, i, n)| format!("{s}.{i} on node {n}"))
                .collect()),
            self.orphans.len(),
            few(self
                .orphans
                .iter()
                .map(|(n, k)| format!("{k} on node {n}"))
                .collect()),
            self.damaged.len(),
            few(self
                .damaged
                .iter()
                .map(|(n, k)| format!("{k} on node {n}"))
                .collect()),
            self.garbage,
            self.orphan_inodes,
            self.first_missing.as_deref().unwrap_or("none"),
            self.layout,
            self.cold_missing.len(),
            self.cold_stripes,
            few(self.cold_missing.iter().map(|s| s.to_string()).collect()),
            self.stray_objects,
            self.garbage_objects,
        )
    }
}

/// Audits the shards of `stores` (the running nodes') against the metadata as `group`'s
/// replica holds it, and the bucket's objects (id → size, listed before the replica was
/// read) when the cluster has a cold tier.
pub fn audit(
    group: &Group,
    stores: &BTreeMap<u64, Arc<NodeStore>>,
    bucket: Option<&BTreeMap<u128, u64>>,
) -> Result<Audit, String> {
    let ns = group.store();
    let mut audit = Audit::default();
    if let Some(objects) = bucket {
        audit_bucket(
            &mut audit,
            &ns.cold_inventory().map_err(|e| e.to_string())?,
            objects,
        );
    }
    // Where each shard should be: (stripe, index) → node.
    let mut expected: BTreeMap<(u128, u8), u64> = BTreeMap::new();
    let mut records = Vec::new();
    let mut after = None;
    loop {
        let page = ns.stripes(after, 512).map_err(|e| e.to_string())?;
        let Some(last) = page.last() else { break };
        after = Some(last.id);
        for record in &page {
            audit.stripes += 1;
            for s in &record.shards {
                expected.insert((record.id.0, s.index), s.node.0);
            }
        }
        records.extend(page);
    }
    if let Ok(Some(layout)) = ns.cluster_layout() {
        audit.layout = node_states(&layout);
    }
    let mut freed: BTreeSet<u128> = BTreeSet::new();
    let mut after = None;
    loop {
        let page = ns.garbage(after, 512).map_err(|e| e.to_string())?;
        let Some(last) = page.last() else { break };
        after = Some(last.id);
        freed.extend(page.iter().map(|r| r.id.0));
    }
    audit.garbage = freed.len();
    audit.orphan_inodes = ns.orphans().map_err(|e| e.to_string())?.len();
    let held: BTreeSet<(u128, u8, u64)> = stores
        .iter()
        .flat_map(|(id, store)| {
            store
                .list()
                .into_iter()
                .map(move |(k, _)| (k.stripe, k.index, *id))
        })
        .collect();
    for (&(stripe, index), &node) in &expected {
        if !held.contains(&(stripe, index, node)) {
            audit.missing.push((StripeId(stripe), index, NodeId(node)));
        }
    }
    for record in &records {
        for s in &record.shards {
            let key = ShardKey {
                stripe: record.id.0,
                index: s.index,
            };
            let Some(NodeStore::Mem(store)) = stores.get(&s.node.0).map(|st| &**st) else {
                continue;
            };
            let damaged = match store.read_now(key) {
                Ok(bytes) => crc32c::crc32c(&bytes) != s.crc32c,
                Err(StoreError::NotFound(_)) => false,
                Err(_) => true,
            };
            if damaged {
                audit.damaged.push((s.node.0, key));
            }
        }
    }
    audit.first_missing = audit.missing.first().and_then(|(id, _, _)| {
        let record = records.iter().find(|r| r.id == *id)?;
        let slots: Vec<String> = record
            .shards
            .iter()
            .map(|s| {
                let at = held.contains(&(id.0, s.index, s.node.0));
                format!(
                    "{}@{}{}",
                    s.index,
                    s.node.0,
                    if at { "" } else { " (missing)" }
                )
            })
            .collect();
        let disowned = ns.disowned(*id).unwrap_or_default();
        let fences: Vec<String> = disowned
            .iter()
            .map(|(index, node)| format!("{index}@{}", node.0))
            .collect();
        Some(format!(
            "{id} [{}], disowned (fenced) [{}]",
            slots.join(", "),
            fences.join(", ")
        ))
    });
    for &(stripe, index, node) in &held {
        let named_here = expected.get(&(stripe, index)) == Some(&node);
        if !named_here && !freed.contains(&stripe) {
            audit.orphans.push((node, ShardKey { stripe, index }));
        }
    }
    Ok(audit)
}

/// The bucket's `objects` against the metadata's `inventory`.
fn audit_bucket(
    audit: &mut Audit,
    inventory: &shoal_namespace::ColdInventory,
    objects: &BTreeMap<u128, u64>,
) {
    audit.cold_stripes = inventory.stripes.len();
    for (stripe, loc) in &inventory.stripes {
        let fits = objects
            .get(&loc.object)
            .is_some_and(|size| loc.offset + loc.len <= *size);
        if !fits {
            audit.cold_missing.push(*stripe);
        }
    }
    audit.stray_objects = objects
        .keys()
        .filter(|id| !inventory.objects.contains_key(id) && !inventory.garbage.contains(id))
        .count();
    audit.garbage_objects = inventory.garbage.len();
}

/// The layout's nodes and their states, as "id:State" words.
pub fn node_states(layout: &shoal_placement::Layout) -> String {
    layout
        .nodes()
        .iter()
        .map(|n| format!("{}:{:?}", n.id.0, n.state))
        .collect::<Vec<_>>()
        .join(" ")
}
