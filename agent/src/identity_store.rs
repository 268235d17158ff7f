//! The node's stable identity in its data dir: the node id its certificate names, kept once
//! the data dir holds anything, and a generation counter bumped at every start so peers can
//! tell a restart from a stale packet.
//!
//! A new data dir adopts the certificate's id into `DATA/node_id`; a data dir of another
//! node is refused at start, naming both ids. `DATA/generation` is bumped and written
//! atomically at every start, then raised above every generation the peers know for the
//! node (`meta/who-am-i`, asked of the members its metadata state knew, waiting 3 s, before
//! membership starts: `check_against_cluster` in `node.rs`). A node renewed while running
//! counts up in memory only, and a restart with a lower generation would lose every address
//! conflict. The leader's steward records each member's generation in Raft
//! (`RecordGenerations`), which is how a stale copy of a data dir is found (`rejoin.rs`).

use std::path::Path;

use shoal_mesh::NodeId;

use crate::AgentError;

const NODE_ID_FILE: &str = "node_id";
const GENERATION_FILE: &str = "generation";

/// Who this node is, for this run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeIdentity {
    pub node: NodeId,
    pub generation: u64,
    /// The generation the data dir recorded before this start (0 for a new one): the
    /// life its state comes from.
    pub previous_generation: u64,
}

impl NodeIdentity {
    /// Loads the node id and records a new generation. The id is the one this node's
    /// certificate names (`certified`): a new data dir takes it, an existing one must
    /// already have it (a certificate of another node, or a data dir of another node, is
    /// refused, naming both ids).
    pub fn load_or_create(data_dir: &Path, certified: NodeId) -> Result<Self, AgentError> {
        let id_path = data_dir.join(NODE_ID_FILE);
        let node = match read_text(&id_path)? {
            Some(text) => text.parse::<NodeId>().map_err(|e| AgentError::Corrupt {
                path: id_path.clone(),
                reason: format!("not a node id: {e}"),
            })?,
            None => {
                write_atomically(&id_path, &format!("{certified}\n"))?;
                certified
            }
        };
        if node != certified {
            return Err(AgentError::CertificateOfAnotherNode {
                data_dir: data_dir.to_owned(),
                data: node,
                certified,
            });
        }
        let gen_path = data_dir.join(GENERATION_FILE);
        let previous = match read_text(&gen_path)? {
            Some(text) => text
                .trim()
                .parse::<u64>()
                .map_err(|e| AgentError::Corrupt {
                    path: gen_path.clone(),
                    reason: format!("not a generation number: {e}"),
                })?,
            None => 0,
        };
        let generation = previous + 1;
        write_atomically(&gen_path, &format!("{generation}\n"))?;
        Ok(NodeIdentity {
            node,
            generation,
            previous_generation: previous,
        })
    }

    /// Raises this run's generation to at least `min` (recorded in the data dir): the
    /// cluster knows a later life of this node than its data dir does, and a lower
    /// generation would lose to it in membership.
    pub fn raise_generation(&mut self, data_dir: &Path, min: u64) -> Result<(), AgentError> {
        if min <= self.generation {
            return Ok(());
        }
        write_atomically(&data_dir.join(GENERATION_FILE), &format!("{min}\n"))?;
        self.generation = min;
        Ok(())
    }
}

fn read_text(path: &Path) -> Result<Option<String>, AgentError> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(AgentError::DataDir {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Writes `text` durably over `path` (a crash leaves either the old or the new content).
fn write_atomically(path: &Path, text: &str) -> Result<(), AgentError> {
    crate::durable::replace_file(path, text.as_bytes()).map_err(|source| AgentError::DataDir {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: NodeId = NodeId(0x0123_4567_89ab_cdef);

    #[test]
    fn id_is_the_certificates_and_generation_grows_across_restarts() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = NodeIdentity::load_or_create(dir.path(), ID).expect("first");
        let second = NodeIdentity::load_or_create(dir.path(), ID).expect("second");
        assert_eq!((first.node, second.node), (ID, ID));
        assert_eq!(second.generation, first.generation + 1);
        assert_eq!(second.previous_generation, first.generation);
        let mut third = NodeIdentity::load_or_create(dir.path(), ID).expect("third");
        third.raise_generation(dir.path(), 10).expect("raise");
        assert_eq!(third.generation, 10);
        let fourth = NodeIdentity::load_or_create(dir.path(), ID).expect("fourth");
        assert_eq!((fourth.previous_generation, fourth.generation), (10, 11));
    }

    #[test]
    fn a_certificate_of_another_node_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        NodeIdentity::load_or_create(dir.path(), ID).expect("first");
        let err = NodeIdentity::load_or_create(dir.path(), NodeId(7)).expect_err("other");
        assert!(
            matches!(err, AgentError::CertificateOfAnotherNode { .. }),
            "{err}"
        );
        assert!(
            err.to_string().contains("--node-id 0123456789abcdef"),
            "{err}"
        );
    }

    #[test]
    fn damaged_id_file_is_reported_not_replaced() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(NODE_ID_FILE), "zz-not-hex").expect("write");
        let err = NodeIdentity::load_or_create(dir.path(), ID).expect_err("must fail");
        assert!(matches!(err, AgentError::Corrupt { .. }), "{err}");
        assert_eq!(
            std::fs::read_to_string(dir.path().join(NODE_ID_FILE)).expect("read"),
            "zz-not-hex"
        );
    }
}
