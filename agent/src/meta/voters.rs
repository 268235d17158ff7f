//! Which members vote in the metadata group (pure).

use std::collections::BTreeSet;

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

#[cfg(test)]
mod tests {
    use super::*;

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
