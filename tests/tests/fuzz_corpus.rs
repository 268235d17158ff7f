//! Replays the fuzz targets' corpora (`tests/fuzz/corpus/TARGET`) and every input that ever
//! crashed one (`tests/fuzz/regressions/TARGET`) through the same entry points the fuzzer
//! drives: each must return without a panic. The fuzzer itself runs in CI for a few seconds
//! per target (`tests/fuzz/run.sh`); this replay needs no fuzzer and no special toolchain.

use std::path::{Path, PathBuf};

type Target = fn(&[u8]);

const TARGETS: [(&str, Target); 9] = [
    ("socket_frame", shoal_agent_api::fuzz::socket_frame),
    ("gossip", shoal_mesh::fuzz::gossip),
    ("rpc_frame", shoal_mesh::fuzz::rpc),
    ("bulk_frame", shoal_mesh::fuzz::bulk),
    ("shard_file", shoal_store::fuzz::shard_file),
    ("snapshot", shoal_namespace::fuzz::snapshot),
    ("log_batch", shoal_namespace::fuzz::batch),
    ("raft_rpc", shoal_agent::consensus::fuzz::raft_rpc),
    ("log_record", shoal_agent::consensus::fuzz::log_record),
];

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_target_has_a_fuzz_binary_and_a_corpus() {
    for (name, _) in TARGETS {
        let source = fuzz_dir().join("fuzz_targets").join(format!("{name}.rs"));
        assert!(source.is_file(), "{} is missing", source.display());
        let corpus = fuzz_dir().join("corpus").join(name);
        assert!(
            !inputs(&corpus).is_empty(),
            "{} is empty: run the target to grow it",
            corpus.display()
        );
    }
}

#[test]
fn corpora_and_past_crashes_replay_without_a_panic() {
    let mut replayed = 0;
    for (name, target) in TARGETS {
        for kind in ["corpus", "regressions"] {
            for file in inputs(&fuzz_dir().join(kind).join(name)) {
                let bytes = std::fs::read(&file).expect("read input");
                let run = std::panic::catch_unwind(|| target(&bytes));
                assert!(run.is_ok(), "{name} panicked on {}", file.display());
                replayed += 1;
            }
        }
    }
    eprintln!("{replayed} inputs replayed");
}
