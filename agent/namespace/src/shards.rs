//! Where a live stripe's shards are: relocating them (repair, scrub) and letting a node
//! delete the copies the records do not name there (see `Command::RelocateShards` and
//! `Command::DisownShards`).

use shoal_agent_api::FsError;
use shoal_placement::{NodeId, StripeId};

use crate::tx::Tx;
use crate::{NamespaceError, Outcome, ShardMove};

/// `planned_at`: the cluster clock of the replica the moves were planned on, when the
/// command says (a fence set before it does not refuse a move; any fence does without it).
pub(crate) fn relocate_shards(
    tx: &mut Tx<'_>,
    stripe: StripeId,
    moves: &[ShardMove],
    planned_at: Option<u64>,
) -> Result<Outcome, NamespaceError> {
    let Some(mut entry) = tx.live_stripe(stripe)? else {
        return Err(FsError::NotFound.into());
    };
    // A cold stripe's bytes are in the bucket; its slots stay empty until it is warmed.
    if tx.cold(stripe)?.is_some() {
        return Ok(Outcome::Conflict);
    }
    let shards = &mut entry.record.shards;
    for m in moves {
        let Some(slot) = shards.get(usize::from(m.index)) else {
            return Err(FsError::Invalid.into());
        };
        if slot.node != m.from || m.from == m.to {
            return Ok(Outcome::Conflict);
        }
        // A fence at the planner's own clock may come after its snapshot in the log.
        if !m.to.is_none()
            && let Some(fenced_at) = tx.disowned_at(stripe, m.index, m.to)?
            && planned_at.is_none_or(|planned| fenced_at >= planned)
        {
            return Ok(Outcome::Conflict);
        }
    }
    for m in moves {
        if let Some(slot) = shards.get_mut(usize::from(m.index)) {
            slot.node = m.to;
            slot.crc32c = m.crc32c;
        }
    }
    // One node holds at most one shard of a stripe (its loss must cost one shard only).
    let mut held: Vec<NodeId> = shards
        .iter()
        .map(|s| s.node)
        .filter(|n| !n.is_none())
        .collect();
    held.sort_unstable();
    if held.windows(2).any(|w| w[0] == w[1]) {
        return Ok(Outcome::Conflict);
    }
    tx.put_live_stripe(&entry)?;
    Ok(Outcome::Done)
}

pub(crate) fn disown_shards(
    tx: &mut Tx<'_>,
    node: NodeId,
    shards: &[(StripeId, u8)],
) -> Result<Outcome, NamespaceError> {
    let mut disowned = Vec::new();
    for &(stripe, index) in shards {
        let record = match tx.live_stripe(stripe)? {
            Some(entry) => entry.record,
            None => match tx.garbage_stripe(stripe)? {
                Some(record) => record,
                // Unknown: the orphan sweep's to fence (AbandonStripes).
                None => continue,
            },
        };
        let named_here = record
            .shards
            .get(usize::from(index))
            .is_some_and(|s| s.node == node);
        if named_here {
            continue;
        }
        tx.disown(stripe, index, node)?;
        disowned.push((stripe, index));
    }
    tx.expire_disowned()?;
    Ok(Outcome::Disowned(disowned))
}

#[cfg(test)]
mod tests {
    use shoal_agent_api::ROOT_INO;
    use shoal_placement::{NodeId, StripeId};

    use shoal_agent_api::StripeRecord;

    use crate::format::{FsError, Ino, SetAttr};
    use crate::testkit::{Kit, extent};
    use crate::{Command, Outcome, ShardMove};

    fn mv(index: u8, from: u64, to: u64) -> ShardMove {
        ShardMove {
            index,
            from: NodeId(from),
            to: NodeId(to),
            crc32c: 0xc0ffee,
        }
    }

    fn relocate(kit: &mut Kit, stripe: u128, moves: Vec<ShardMove>) -> Outcome {
        kit.run(Command::RelocateShards {
            stripe: StripeId(stripe),
            moves,
        })
    }

    fn record(kit: &Kit, stripe: u128) -> StripeRecord {
        kit.store
            .live_stripe(StripeId(stripe))
            .expect("query")
            .expect("live")
    }

    /// A file with one extent in stripe 7, whose shards 0, 1, 2 are on nodes 1, 2, 3.
    fn kit_with_stripe() -> (Kit, Ino) {
        let mut kit = Kit::new();
        let f = kit.mkfile(ROOT_INO, "f");
        kit.write_extents(f, vec![extent(0, 10, 7)]);
        (kit, f)
    }

    #[test]
    fn a_relocation_moves_a_slot_only_from_the_node_it_names() {
        let (mut kit, _) = kit_with_stripe();
        assert_eq!(relocate(&mut kit, 7, vec![mv(2, 3, 9)]), Outcome::Done);
        let r = record(&kit, 7);
        assert_eq!(
            (r.shards[2].node, r.shards[2].crc32c),
            (NodeId(9), 0xc0ffee)
        );
        // The same move again: its slot names 9 now, not 3.
        assert_eq!(relocate(&mut kit, 7, vec![mv(2, 3, 8)]), Outcome::Conflict);
        // Two moves, one stale: neither applies.
        assert_eq!(
            relocate(&mut kit, 7, vec![mv(0, 1, 5), mv(1, 4, 6)]),
            Outcome::Conflict
        );
        assert_eq!(record(&kit, 7).shards[0].node, NodeId(1));
        // Giving a shard up, then filling the slot again.
        assert_eq!(relocate(&mut kit, 7, vec![mv(0, 1, 0)]), Outcome::Done);
        assert!(record(&kit, 7).shards[0].node.is_none());
        assert_eq!(relocate(&mut kit, 7, vec![mv(0, 0, 4)]), Outcome::Done);
        assert_eq!(record(&kit, 7).shards[0].node, NodeId(4));
    }

    #[test]
    fn a_relocation_never_puts_two_shards_of_a_stripe_on_one_node() {
        let (mut kit, _) = kit_with_stripe();
        assert_eq!(relocate(&mut kit, 7, vec![mv(0, 1, 2)]), Outcome::Conflict);
        assert_eq!(record(&kit, 7).shards[0].node, NodeId(1));
        assert_eq!(
            relocate(&mut kit, 7, vec![mv(0, 1, 5), mv(1, 2, 5)]),
            Outcome::Conflict
        );
    }

    #[test]
    fn a_relocation_of_a_stripe_that_is_not_live_is_refused() {
        let mut kit = Kit::new();
        assert_eq!(
            relocate(&mut kit, 7, vec![mv(0, 1, 5)]),
            Outcome::Failed(FsError::NotFound)
        );
        let (mut kit, _) = kit_with_stripe();
        assert_eq!(
            relocate(&mut kit, 7, vec![mv(3, 1, 5)]),
            Outcome::Failed(FsError::Invalid),
            "no slot 3 in a 2+1 stripe"
        );
    }

    #[test]
    fn a_disowned_shard_is_fenced_against_a_late_relocation_to_its_node() {
        let (mut kit, _) = kit_with_stripe();
        // Node 9 holds a copy of shard 2 that the record does not name (a repair stored it
        // and crashed before its commit); node 3 holds the one the record names.
        let out = kit.run(Command::DisownShards {
            node: NodeId(9),
            shards: vec![(StripeId(7), 2), (StripeId(8), 0)],
        });
        assert_eq!(
            out,
            Outcome::Disowned(vec![(StripeId(7), 2)]),
            "an unknown stripe is the orphan sweep's"
        );
        // The old repair's commit arrives late: refused, the shard on 9 is gone.
        assert_eq!(relocate(&mut kit, 7, vec![mv(2, 3, 9)]), Outcome::Conflict);
        // Another target is fine.
        assert_eq!(relocate(&mut kit, 7, vec![mv(2, 3, 5)]), Outcome::Done);
        // A node the record names keeps its shard.
        let out = kit.run(Command::DisownShards {
            node: NodeId(5),
            shards: vec![(StripeId(7), 2)],
        });
        assert_eq!(out, Outcome::Disowned(vec![]));
        assert_eq!(
            kit.store.disowned(StripeId(7)).expect("query"),
            vec![(2, NodeId(9))]
        );
    }

    /// The simulator found this (seeds 202 and 214 of `repair`): a node that disowned a
    /// copy of a slot stayed fenced for it for a day, so a stripe whose only possible
    /// home for that slot was that node (five nodes, four slots, one lost) stayed short
    /// of a shard all that time. A relocation planned on a replica that had applied the
    /// fence cannot be the late commit the fence is for: it may take the slot there.
    #[test]
    fn a_relocation_planned_after_a_fence_may_take_the_slot_to_its_node() {
        let mut kit = Kit::stamped();
        let f = kit.mkfile(ROOT_INO, "f");
        kit.write_extents(f, vec![extent(0, 10, 7)]);
        let before = kit.store.clock_ms().expect("clock");
        kit.run(Command::DisownShards {
            node: NodeId(9),
            shards: vec![(StripeId(7), 2)],
        });
        let at_fence = kit.store.clock_ms().expect("clock");
        let planned = |kit: &mut Kit, planned_at_ms| {
            kit.run(Command::RelocateShardsPlanned {
                stripe: StripeId(7),
                moves: vec![mv(2, 3, 9)],
                planned_at_ms,
            })
        };
        assert_eq!(
            planned(&mut kit, before),
            Outcome::Conflict,
            "planned before"
        );
        assert_eq!(
            planned(&mut kit, at_fence),
            Outcome::Conflict,
            "the same clock may be before the fence's entry or after it"
        );
        let after = kit.store.clock_ms().expect("clock");
        assert!(after > at_fence);
        assert_eq!(
            relocate(&mut kit, 7, vec![mv(2, 3, 9)]),
            Outcome::Conflict,
            "a relocation that does not say when it was planned is refused, as before"
        );
        assert_eq!(planned(&mut kit, after), Outcome::Done);
        assert_eq!(record(&kit, 7).shards[2].node, NodeId(9));
    }

    #[test]
    fn fences_expire_after_a_day_of_cluster_time() {
        let mut kit = Kit::stamped();
        let f = kit.mkfile(ROOT_INO, "f");
        kit.write_extents(f, vec![extent(0, 10, 7)]);
        kit.run(Command::DisownShards {
            node: NodeId(9),
            shards: vec![(StripeId(7), 2)],
        });
        kit.clock += (crate::tx::ABANDON_KEEP_MS / 1000) as i64 + 10;
        kit.run(Command::DisownShards {
            node: NodeId(9),
            shards: vec![],
        });
        assert!(kit.store.disowned(StripeId(7)).expect("query").is_empty());
    }

    #[test]
    fn a_garbage_stripe_referenced_again_keeps_its_relocated_shards() {
        let (mut kit, f) = kit_with_stripe();
        assert_eq!(relocate(&mut kit, 7, vec![mv(1, 2, 9)]), Outcome::Done);
        kit.run(Command::SetAttr {
            ino: f,
            set: SetAttr {
                size: Some(0),
                ..SetAttr::default()
            },
        });
        assert!(kit.store.live_stripe(StripeId(7)).expect("query").is_none());
        // A writer still holding the stripe's old record commits it again.
        kit.write_extents(f, vec![extent(0, 10, 7)]);
        assert_eq!(record(&kit, 7).shards[1].node, NodeId(9));
    }
}
