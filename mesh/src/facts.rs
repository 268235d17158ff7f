//! Node facts: what each agent tells the cluster about itself through gossip
//! (foca custom broadcasts). Liveness comes from SWIM; facts ride along.
//!
//! A newer `(generation, seq)` replaces an older one; a stale item is answered `None` to
//! foca, so it stops circulating. A node republishes when a member comes up or renames,
//! when a known node starts a new life, and through the agent's `facts` worker.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use crate::MeshError;
use crate::identity::{MemberId, NodeId};

/// Version of the facts payload on the wire. Within a version, fields are only ever
/// appended: a reader takes a payload with more fields than it knows (ignoring the rest)
/// or with the fields of an earlier release (see [`NodeFacts::decode`]), so agents of
/// neighbouring releases understand each other during a rolling upgrade.
pub const FACTS_VERSION: u8 = 1;

/// What a node intends: serving, or leaving the cluster on purpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeRole {
    Active,
    Leaving,
}

/// Facts a node disseminates about itself. A newer `(generation, seq)` replaces an older one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeFacts {
    pub node: NodeId,
    /// The member generation that published these facts.
    pub generation: u64,
    /// Grows with every publication within one generation.
    pub seq: u64,
    /// Human-readable node name (host name by default).
    pub name: String,
    pub failure_domain: String,
    /// Where this node's QUIC RPC endpoint listens.
    pub rpc_addr: SocketAddr,
    /// Where this node's TCP bulk lane listens, if it runs one.
    pub bulk_addr: Option<SocketAddr>,
    /// Size of the filesystem holding the data dir, in bytes.
    pub capacity_bytes: u64,
    /// Bytes in use on that filesystem.
    pub used_bytes: u64,
    pub role: NodeRole,
    pub agent_version: String,
    /// Whether this node's shard store takes new shards now: false while its I/O ring is
    /// failing, or it has less room than two of the largest shards (`MIN_ROOM` in the
    /// agent's `data/mod.rs`: 2 MiB + 64 KiB). Writers place new shards elsewhere.
    pub store_accepting: bool,
    /// Bytes of new shards the store can take (fill limit and filesystem reserve).
    pub store_room_bytes: u64,
    /// Bytes a second this node's repair worker has been rebuilding lately (0 when it is
    /// not repairing).
    pub repair_bytes_per_sec: u64,
    /// The store is still opening (start-up recovery): no new shards yet, but not full
    /// either; writers wait for it rather than call the cluster full or write degraded.
    /// True from start until the `facts` worker first reports the store.
    pub store_opening: bool,
    /// This node's metadata member failed (its Raft core stopped on a storage error): the
    /// group must not count on it as a voter.
    pub meta_failed: bool,
}

/// Fields appended by the second release.
#[derive(Deserialize)]
struct StoreTail {
    store_accepting: bool,
    store_room_bytes: u64,
}

/// Fields appended by the third release.
#[derive(Deserialize)]
struct RepairTail {
    repair_bytes_per_sec: u64,
    store_opening: bool,
}

/// Fields appended by the fourth release.
#[derive(Deserialize)]
struct MetaTail {
    meta_failed: bool,
}

/// The facts of the first release, before the store fields were appended.
#[derive(Deserialize)]
struct NodeFactsFirst {
    node: NodeId,
    generation: u64,
    seq: u64,
    name: String,
    failure_domain: String,
    rpc_addr: SocketAddr,
    bulk_addr: Option<SocketAddr>,
    capacity_bytes: u64,
    used_bytes: u64,
    role: NodeRole,
    agent_version: String,
}

impl From<NodeFactsFirst> for NodeFacts {
    fn from(f: NodeFactsFirst) -> NodeFacts {
        NodeFacts {
            node: f.node,
            generation: f.generation,
            seq: f.seq,
            name: f.name,
            failure_domain: f.failure_domain,
            rpc_addr: f.rpc_addr,
            bulk_addr: f.bulk_addr,
            capacity_bytes: f.capacity_bytes,
            used_bytes: f.used_bytes,
            role: f.role,
            agent_version: f.agent_version,
            // What a node of that release could tell: room is what its filesystem has.
            store_accepting: true,
            store_room_bytes: f.capacity_bytes.saturating_sub(f.used_bytes),
            repair_bytes_per_sec: 0,
            store_opening: false,
            meta_failed: false,
        }
    }
}

impl NodeFacts {
    fn version(&self) -> (u64, u64) {
        (self.generation, self.seq)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![FACTS_VERSION];
        // Serialising a plain struct into a Vec cannot fail.
        out.extend(postcard::to_allocvec(self).unwrap_or_default());
        out
    }

    /// Decodes the facts of this release or a neighbouring one: fields a release appended
    /// are read when present (defaults otherwise), fields appended after this release's
    /// are ignored.
    pub fn decode(bytes: &[u8]) -> Result<Self, MeshError> {
        match bytes.split_first() {
            Some((&FACTS_VERSION, body)) => {
                let (first, rest) = postcard::take_from_bytes::<NodeFactsFirst>(body)
                    .map_err(|e| MeshError::BadFacts(e.to_string()))?;
                let mut f = NodeFacts::from(first);
                if let Ok((store, rest)) = postcard::take_from_bytes::<StoreTail>(rest) {
                    f.store_accepting = store.store_accepting;
                    f.store_room_bytes = store.store_room_bytes;
                    if let Ok((repair, rest)) = postcard::take_from_bytes::<RepairTail>(rest) {
                        f.repair_bytes_per_sec = repair.repair_bytes_per_sec;
                        f.store_opening = repair.store_opening;
                        if let Ok((meta, _)) = postcard::take_from_bytes::<MetaTail>(rest) {
                            f.meta_failed = meta.meta_failed;
                        }
                    }
                }
                Ok(f)
            }
            Some((v, _)) => Err(MeshError::BadFacts(format!("unknown facts version {v}"))),
            None => Err(MeshError::BadFacts("empty payload".into())),
        }
    }
}

/// The newest facts known for every node, shared between the foca broadcast handler and
/// the rest of the membership code.
#[derive(Clone, Default)]
pub(crate) struct FactsTable {
    newest: Arc<Mutex<BTreeMap<NodeId, NodeFacts>>>,
    /// Set when facts of a later life (generation) of a known node arrive.
    new_life: Arc<std::sync::atomic::AtomicBool>,
}

impl FactsTable {
    pub(crate) fn lock(&self) -> MutexGuard<'_, BTreeMap<NodeId, NodeFacts>> {
        // A poisoned lock only means another thread panicked mid-update of a map of plain
        // values; the map itself is still consistent.
        self.newest.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether facts of a new life of a known node arrived since the last call.
    pub(crate) fn take_new_life(&self) -> bool {
        self.new_life
            .swap(false, std::sync::atomic::Ordering::Relaxed)
    }

    /// Stores `facts` if they are newer than what is known; says whether they were.
    fn offer(&self, facts: NodeFacts) -> bool {
        let mut table = self.lock();
        match table.get(&facts.node) {
            Some(known) if known.version() >= facts.version() => false,
            known => {
                // A node that restarted lost every fact it had heard, even when membership
                // sees no change (its new life may reuse the identity a renewal gave its
                // previous one): the caller republishes ours.
                if known.is_some_and(|k| k.generation < facts.generation) {
                    self.new_life
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                }
                table.insert(facts.node, facts);
                true
            }
        }
    }
}

/// Identifies one facts publication inside foca's broadcast backlog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FactsKey {
    node: NodeId,
    version: (u64, u64),
}

impl foca::Invalidates for FactsKey {
    fn invalidates(&self, other: &Self) -> bool {
        self.node == other.node && self.version >= other.version
    }
}

pub(crate) struct FactsHandler {
    pub(crate) table: FactsTable,
}

impl foca::BroadcastHandler<MemberId> for FactsHandler {
    type Key = FactsKey;
    type Error = MeshError;

    fn receive_item(
        &mut self,
        data: &[u8],
        _sender: Option<&MemberId>,
    ) -> Result<Option<FactsKey>, MeshError> {
        let facts = NodeFacts::decode(data)?;
        let key = FactsKey {
            node: facts.node,
            version: facts.version(),
        };
        // Stale items must yield None, or they would circulate forever.
        Ok(self.table.offer(facts).then_some(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use foca::BroadcastHandler;

    fn facts(seq: u64) -> NodeFacts {
        NodeFacts {
            node: NodeId(9),
            generation: 2,
            seq,
            name: "n9".into(),
            failure_domain: "rack-a".into(),
            rpc_addr: "127.0.0.9:7947".parse().expect("addr"),
            bulk_addr: None,
            capacity_bytes: 100,
            used_bytes: 10,
            role: NodeRole::Active,
            agent_version: "0.1.0".into(),
            store_accepting: false,
            store_room_bytes: 42,
            repair_bytes_per_sec: 7,
            store_opening: true,
            meta_failed: false,
        }
    }

    #[test]
    fn facts_round_trip() {
        let f = facts(3);
        assert_eq!(NodeFacts::decode(&f.encode()).expect("decode"), f);
    }

    /// Golden bytes of the first release's facts (before the store fields were appended),
    /// the second's (before the repair rate) and the third's (before the member failure):
    /// they still decode, and a payload with fields a later release appends decodes too.
    #[test]
    fn facts_of_neighbouring_releases_decode() {
        let first: &[u8] = &[
            1, 9, 2, 3, 2, b'n', b'9', 6, b'r', b'a', b'c', b'k', b'-', b'a', 0, 127, 0, 0, 9,
            0x8b, 0x3e, 0, 100, 10, 0, 5, b'0', b'.', b'1', b'.', b'0',
        ];
        let old = NodeFacts::decode(first).expect("first release");
        assert_eq!(
            old,
            NodeFacts {
                store_accepting: true,
                store_room_bytes: 90,
                repair_bytes_per_sec: 0,
                store_opening: false,
                meta_failed: false,
                ..facts(3)
            }
        );
        // The second release: store fields, no repair rate.
        let mut second = first.to_vec();
        second.extend_from_slice(&[0, 42]);
        assert_eq!(
            NodeFacts::decode(&second).expect("second release"),
            NodeFacts {
                repair_bytes_per_sec: 0,
                store_opening: false,
                meta_failed: false,
                ..facts(3)
            }
        );
        // The third release: up to the store's opening flag; a member failure is unknown.
        let mut third = second.clone();
        third.extend_from_slice(&[7, 1]);
        assert_eq!(
            NodeFacts::decode(&third).expect("third release"),
            NodeFacts {
                meta_failed: false,
                ..facts(3)
            }
        );
        let mut failed = third.clone();
        failed.push(1);
        assert!(NodeFacts::decode(&failed).expect("fourth").meta_failed);
        let mut newer = facts(3).encode();
        newer.extend_from_slice(&[1, 2, 3]);
        assert_eq!(NodeFacts::decode(&newer).expect("newer release"), facts(3));
    }

    #[test]
    fn stale_facts_are_not_rebroadcast() {
        let mut handler = FactsHandler {
            table: FactsTable::default(),
        };
        assert!(
            handler
                .receive_item(&facts(2).encode(), None)
                .expect("ok")
                .is_some()
        );
        assert!(
            handler
                .receive_item(&facts(2).encode(), None)
                .expect("ok")
                .is_none()
        );
        assert!(
            handler
                .receive_item(&facts(1).encode(), None)
                .expect("ok")
                .is_none()
        );
        assert!(
            handler
                .receive_item(&facts(3).encode(), None)
                .expect("ok")
                .is_some()
        );
        assert_eq!(handler.table.lock()[&NodeId(9)].seq, 3);
    }

    #[test]
    fn garbage_facts_are_an_error_not_a_panic() {
        let mut handler = FactsHandler {
            table: FactsTable::default(),
        };
        for bytes in [&[][..], &[1], &[1, 255, 255], &[7, 1, 2, 3]] {
            assert!(handler.receive_item(bytes, None).is_err());
        }
    }
}
