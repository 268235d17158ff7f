//! Which members vote in the metadata group (pure).

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use tokio::time::Instant;

/// How many voters a group of `alive` members should have: 5 from 7 members up, 3 from 3
/// up, otherwise 1 (two voters would only add a second node that must be up).
pub fn voter_target(alive: usize) -> usize {
    match alive {
        0..=2 => 1,
        3..=6 => 3,
        _ => 5,
    }
}

/// A member the voter choice can pick.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub id: u64,
    pub failure_domain: String,
}

/// Chooses voters: keeps the current voters among `alive` (so membership does not churn),
/// then adds members from failure domains not yet represented, then any, lowest ids first.
/// Never returns more than the target for the number of alive members.
pub fn choose_voters(alive: &[Candidate], current: &BTreeSet<u64>) -> BTreeSet<u64> {
    let target = voter_target(alive.len());
    let mut sorted: Vec<&Candidate> = alive.iter().collect();
    sorted.sort_by_key(|c| c.id);
    let mut chosen: Vec<&Candidate> = sorted
        .iter()
        .copied()
        .filter(|c| current.contains(&c.id))
        .take(target)
        .collect();
    for pass in 0..2 {
        for c in &sorted {
            if chosen.len() >= target {
                break;
            }
            if chosen.iter().any(|x| x.id == c.id) {
                continue;
            }
            let new_domain = chosen.iter().all(|x| x.failure_domain != c.failure_domain);
            if pass == 1 || new_domain {
                chosen.push(c);
            }
        }
    }
    chosen.into_iter().map(|c| c.id).collect()
}

/// What the leader knows when it decides the voters (inputs of [`VoterPlan::desired`]).
pub struct VoterPlan<'a> {
    /// The voters now.
    pub voters: &'a BTreeSet<u64>,
    /// Every member of the group (voters and learners).
    pub known: &'a BTreeSet<u64>,
    /// The members gossip sees alive.
    pub alive: &'a [Candidate],
    /// Members being drained: never chosen, and a voter among them gives up its seat.
    pub leaving: &'a BTreeSet<u64>,
    /// Voters not seen alive, since when.
    pub down_since: &'a HashMap<u64, Instant>,
    pub now: Instant,
    /// This node (the leader): always a member.
    pub me: u64,
    /// How long a voter may be down before it is replaced.
    pub replace_after: Duration,
}

impl VoterPlan<'_> {
    /// The voters to change to, if a change is due: voters down for longer than
    /// `replace_after` are replaced (one inside its grace keeps its seat as if alive), the
    /// count follows the number of members, and new voters must already be members.
    pub fn desired(&self) -> Option<BTreeSet<u64>> {
        let keep: BTreeSet<u64> = self
            .voters
            .iter()
            .copied()
            .filter(|v| !self.leaving.contains(v))
            .filter(|v| {
                self.down_since
                    .get(v)
                    .is_none_or(|t| self.now.saturating_duration_since(*t) < self.replace_after)
            })
            .collect();
        let mut candidates: Vec<Candidate> = self
            .alive
            .iter()
            .filter(|c| !self.leaving.contains(&c.id))
            .cloned()
            .collect();
        for v in keep
            .iter()
            .filter(|v| !self.alive.iter().any(|m| m.id == **v))
        {
            candidates.push(Candidate {
                id: *v,
                failure_domain: String::new(),
            });
        }
        let desired = choose_voters(&candidates, &keep);
        let ready = desired
            .iter()
            .all(|d| self.known.contains(d) || *d == self.me);
        (desired != *self.voters && ready).then_some(desired)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_for<'a>(
        voters: &'a BTreeSet<u64>,
        known: &'a BTreeSet<u64>,
        alive: &'a [Candidate],
        down_since: &'a HashMap<u64, Instant>,
        now: Instant,
    ) -> VoterPlan<'a> {
        VoterPlan {
            voters,
            known,
            alive,
            leaving: &NOBODY,
            down_since,
            now,
            me: 1,
            replace_after: Duration::from_secs(30),
        }
    }

    static NOBODY: BTreeSet<u64> = BTreeSet::new();

    #[test]
    fn a_voter_being_drained_gives_up_its_seat_at_once() {
        let voters = BTreeSet::from([1, 2, 3]);
        let known = BTreeSet::from([1, 2, 3, 4]);
        let alive = cands(&[(1, "a"), (2, "b"), (3, "c"), (4, "d")]);
        let leaving = BTreeSet::from([3]);
        let down = HashMap::new();
        let plan = VoterPlan {
            leaving: &leaving,
            ..plan_for(&voters, &known, &alive, &down, Instant::now())
        };
        assert_eq!(plan.desired(), Some(BTreeSet::from([1, 2, 4])));
    }

    #[test]
    fn a_voter_down_past_its_grace_is_replaced_by_a_member() {
        let voters = BTreeSet::from([1, 2, 3]);
        let known = BTreeSet::from([1, 2, 3, 4]);
        let alive = cands(&[(1, "a"), (2, "b"), (4, "d")]);
        let t0 = Instant::now();
        let down = HashMap::from([(3, t0)]);
        let within = plan_for(&voters, &known, &alive, &down, t0 + Duration::from_secs(10));
        assert_eq!(within.desired(), None, "inside the grace it keeps its seat");
        let past = plan_for(&voters, &known, &alive, &down, t0 + Duration::from_secs(31));
        assert_eq!(past.desired(), Some(BTreeSet::from([1, 2, 4])));
    }

    #[test]
    fn a_replacement_must_already_be_a_member() {
        let voters = BTreeSet::from([1, 2, 3]);
        let known = BTreeSet::from([1, 2, 3]);
        let alive = cands(&[(1, "a"), (2, "b"), (4, "d")]);
        let t0 = Instant::now();
        let down = HashMap::from([(3, t0)]);
        let past = plan_for(&voters, &known, &alive, &down, t0 + Duration::from_secs(31));
        assert_eq!(past.desired(), None, "4 is not a learner yet");
    }

    #[test]
    fn more_members_bring_more_voters() {
        let voters = BTreeSet::from([1]);
        let known = BTreeSet::from([1, 2, 3]);
        let alive = cands(&[(1, "a"), (2, "b"), (3, "c")]);
        let down = HashMap::new();
        let p = plan_for(&voters, &known, &alive, &down, Instant::now());
        assert_eq!(p.desired(), Some(BTreeSet::from([1, 2, 3])));
    }

    fn cands(spec: &[(u64, &str)]) -> Vec<Candidate> {
        spec.iter()
            .map(|(id, d)| Candidate {
                id: *id,
                failure_domain: (*d).into(),
            })
            .collect()
    }

    #[test]
    fn voters_spread_across_failure_domains() {
        let alive = cands(&[(1, "a"), (2, "a"), (3, "b"), (4, "b"), (5, "c")]);
        let v = choose_voters(&alive, &BTreeSet::new());
        assert_eq!(v, BTreeSet::from([1, 3, 5]));
    }

    #[test]
    fn current_voters_are_kept_while_alive() {
        let alive = cands(&[(1, "a"), (2, "b"), (3, "c"), (4, "d")]);
        let v = choose_voters(&alive, &BTreeSet::from([2, 3, 4]));
        assert_eq!(v, BTreeSet::from([2, 3, 4]));
    }

    #[test]
    fn a_dead_voter_is_replaced() {
        let alive = cands(&[(1, "a"), (2, "b"), (4, "d"), (5, "e")]);
        let v = choose_voters(&alive, &BTreeSet::from([2, 3, 4]));
        assert_eq!(v, BTreeSet::from([1, 2, 4]));
    }

    #[test]
    fn five_voters_from_seven_members() {
        let alive = cands(&[
            (1, "a"),
            (2, "b"),
            (3, "c"),
            (4, "d"),
            (5, "e"),
            (6, "f"),
            (7, "g"),
        ]);
        assert_eq!(choose_voters(&alive, &BTreeSet::new()).len(), 5);
        assert_eq!(voter_target(2), 1);
        assert_eq!(voter_target(6), 3);
    }

    #[test]
    fn one_domain_still_gets_enough_voters() {
        let alive = cands(&[(1, "a"), (2, "a"), (3, "a")]);
        assert_eq!(
            choose_voters(&alive, &BTreeSet::new()),
            BTreeSet::from([1, 2, 3])
        );
    }
}
