//! Which alive members run another release than this agent. A new log command (or any
//! change an older agent could not apply) is proposed only while this list is empty:
//! drain's node changes, repair's planned relocations, the cold tier's commands, name
//! revocations. Releases are compared by `AGENT_VERSION`, so each release that adds a
//! command must bump the version.

use shoal_mesh::{MemberState, MemberView};

/// The alive members that run another release than this agent, as "name runs version".
pub fn alive_on_other_releases(members: &[MemberView]) -> Vec<String> {
    other_releases(
        members
            .iter()
            .filter(|m| m.state == MemberState::Alive)
            .filter_map(|m| m.facts.as_ref())
            .map(|f| (f.name.as_str(), f.agent_version.as_str())),
        crate::AGENT_VERSION,
    )
}

fn other_releases<'a>(
    versions: impl IntoIterator<Item = (&'a str, &'a str)>,
    mine: &str,
) -> Vec<String> {
    versions
        .into_iter()
        .filter(|(_, v)| *v != mine)
        .map(|(name, v)| format!("{name} runs {v}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::other_releases;

    #[test]
    fn members_on_another_release_are_named() {
        let versions = [("gpu1", "0.2.0"), ("gpu2", "0.1.0"), ("gpu3", "0.2.0")];
        assert_eq!(other_releases(versions, "0.2.0"), ["gpu2 runs 0.1.0"]);
        assert!(other_releases(versions[..1].iter().copied(), "0.2.0").is_empty());
    }
}
