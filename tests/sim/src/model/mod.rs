//! [`Model`]: what the cluster acknowledged, in the order the clients saw it, and the
//! violations found against it. Events are numbered as they happen (one thread): an
//! acknowledgement numbered before a read began must be visible to that read. Names
//! created are tracked here, files' contents in [`files`].

mod files;

pub use files::FileHistory;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

#[derive(Default)]
struct State {
    events: u64,
    proposed: BTreeSet<String>,
    /// The same names, in the order they were proposed.
    order: Vec<String>,
    /// Each acknowledged create, with the event of its acknowledgement.
    acked: BTreeMap<String, u64>,
    /// Files whose create was acknowledged, by name.
    files: BTreeMap<String, FileHistory>,
    violations: Vec<String>,
    /// The last event at which some replica's layout had each node `out`.
    seen_out: BTreeMap<u64, u64>,
}

#[derive(Clone, Default)]
pub struct Model(Arc<Mutex<State>>);

impl Model {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Numbers an event (e.g. a read beginning).
    pub fn event(&self) -> u64 {
        let mut s = self.state();
        s.events += 1;
        s.events
    }

    pub fn proposed(&self, name: &str) {
        let mut s = self.state();
        if s.proposed.insert(name.to_owned()) {
            s.order.push(name.to_owned());
        }
    }

    pub fn acked(&self, name: &str) {
        let mut s = self.state();
        s.events += 1;
        let at = s.events;
        s.acked.insert(name.to_owned(), at);
    }

    /// One of the `last` names proposed most recently (all of them for `None`), picked by
    /// `pick` (an index below the count).
    pub fn some_proposed(
        &self,
        last: Option<usize>,
        pick: impl FnOnce(u64) -> u64,
    ) -> Option<String> {
        let s = self.state();
        let from = last.map_or(0, |l| s.order.len().saturating_sub(l));
        let names = s.order.get(from..)?;
        let i = usize::try_from(pick(names.len() as u64)).ok()?;
        names.get(i).cloned()
    }

    /// Checks a read of `name` that began at event `began` and found it (`found`).
    /// Returns the violation it is, if any.
    pub fn check_read(&self, name: &str, began: u64, found: bool, node: u64) -> Option<String> {
        let mut s = self.state();
        let violation = match (found, s.acked.get(name)) {
            (true, _) if !s.proposed.contains(name) => {
                Some(format!("node {node} shows {name}, which nobody created"))
            }
            (false, Some(&at)) if at < began => Some(format!(
                "stale read on node {node}: {name} was acknowledged (event {at}) before the read began (event {began}), and the read does not see it"
            )),
            _ => None,
        };
        if let Some(v) = &violation {
            s.violations.push(v.clone());
        }
        violation
    }

    /// The create of file `name` (inode `ino`) was acknowledged.
    pub fn file_created(&self, name: &str, ino: u64) {
        let mut s = self.state();
        s.events += 1;
        let at = s.events;
        s.files
            .insert(name.to_owned(), FileHistory::created(ino, at));
    }

    /// Runs `f` on file `name`'s history (None if its create was not acknowledged); an
    /// acknowledgement takes an event number first (`ack`).
    pub fn file<T>(
        &self,
        name: &str,
        ack: bool,
        f: impl FnOnce(&mut FileHistory, u64) -> T,
    ) -> Option<T> {
        let mut s = self.state();
        let at = if ack {
            s.events += 1;
            s.events
        } else {
            s.events
        };
        s.files.get_mut(name).map(|h| f(h, at))
    }

    /// One of the files not unlinked, picked by `pick` (an index below the count): its
    /// name and inode.
    pub fn some_file(&self, pick: impl FnOnce(u64) -> u64) -> Option<(String, u64)> {
        let files = self.files();
        let i = usize::try_from(pick(files.len() as u64)).ok()?;
        files.get(i).cloned()
    }

    /// Every file not unlinked: name and inode.
    pub fn files(&self) -> Vec<(String, u64)> {
        let s = self.state();
        s.files
            .iter()
            .filter(|(_, h)| !h.unlinked)
            .map(|(n, h)| (n.clone(), h.ino))
            .collect()
    }

    /// Checks `read`, the contents of file `name` read through node `node` by a read that
    /// began at event `began` (u64::MAX: after every acknowledgement). The violation, if
    /// any.
    pub fn check_file_read(
        &self,
        name: &str,
        ino: u64,
        began: u64,
        read: &[u8],
        node: u64,
    ) -> Option<String> {
        let mut s = self.state();
        // The name may be another file's by now (renamed over): only its own history
        // says what inode `ino` may hold.
        let checked = s
            .files
            .get(name)
            .filter(|h| h.ino == ino)
            .map(|h| h.check(read, began));
        match checked {
            Some(Err(e)) => {
                let v = format!("node {node}, file {name}: {e}");
                s.violations.push(v.clone());
                Some(v)
            }
            _ => None,
        }
    }

    /// A rename of file `from` over file `to` is sent: from now on `to` names `from`'s
    /// file (`to`'s own is replaced: no read picks it any more). Until the rename is
    /// acknowledged ([`Self::renamed`]) neither name is sure.
    /// Says whether `from` surely named its file (else `to` is not sure either, however
    /// the rename ends).
    pub fn renaming(&self, from: &str, to: &str) -> bool {
        let mut s = self.state();
        let Some(mut h) = s.files.remove(from) else {
            return false;
        };
        let sure = h.name_sure;
        h.name_sure = false;
        s.files.insert(to.to_owned(), h);
        sure
    }

    /// The rename onto `to` was acknowledged: `to` names the file now, surely if its old
    /// name did (`sure`, from [`Self::renaming`]).
    pub fn renamed(&self, to: &str, sure: bool) {
        if let Some(h) = self.state().files.get_mut(to) {
            h.name_sure = sure;
        }
    }

    /// The files whose name is sure (no rename onto or from it has an unknown outcome):
    /// name and inode.
    pub fn sure_names(&self) -> Vec<(String, u64)> {
        self.state()
            .files
            .iter()
            .filter(|(_, h)| h.name_sure && !h.unlinked)
            .map(|(n, h)| (n.clone(), h.ino))
            .collect()
    }

    /// Some replica's layout has node `id` out now.
    pub fn seen_out(&self, id: u64) {
        let mut s = self.state();
        s.events += 1;
        let at = s.events;
        s.seen_out.insert(id, at);
    }

    /// Whether a layout had node `id` out at or after event `since`.
    pub fn out_since(&self, id: u64, since: u64) -> bool {
        self.state()
            .seen_out
            .get(&id)
            .is_some_and(|&at| at >= since)
    }

    pub fn violation(&self, what: String) {
        self.state().violations.push(what);
    }

    pub fn acked_names(&self) -> Vec<String> {
        self.state().acked.keys().cloned().collect()
    }

    pub fn violations(&self) -> Vec<String> {
        self.state().violations.clone()
    }

    pub fn counts(&self) -> (usize, usize) {
        let s = self.state();
        (s.proposed.len(), s.acked.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_must_see_what_was_acknowledged_before_it_began() {
        let m = Model::default();
        m.proposed("a");
        let early = m.event();
        m.acked("a");
        let late = m.event();
        assert_eq!(
            m.check_read("a", early, false, 1),
            None,
            "concurrent: either"
        );
        assert!(m.check_read("a", late, false, 1).is_some(), "stale");
        assert_eq!(m.check_read("a", late, true, 1), None);
        assert!(m.check_read("b", late, true, 1).is_some(), "never created");
        assert_eq!(m.violations().len(), 2);
    }
}
