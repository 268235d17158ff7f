//! The two-mount differential check: seeded random operations, each on one of two nodes'
//! mounts (whichever the draw says) and on a local directory, one after another. Every
//! operation must end as it does locally (the same success, or the same errno), and every
//! few steps the trees seen through both mounts must equal the local one, names, kinds and
//! bytes. Close-to-open across nodes and local POSIX semantics in one check; with the
//! default `metadata_writeback_ms`, one node's run of changes in a directory is answered
//! from its lease, and the other node's next step there recalls it.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use shoal_disk::SplitMix64 as Rng;
use shoal_tests::{DevCluster, stream_bytes};

/// One operation, on paths relative to a root.
#[derive(Debug)]
enum Op {
    Write { path: String, seed: u64, len: usize },
    Append { path: String, seed: u64, len: usize },
    Mkdir(String),
    Rmdir(String),
    Unlink(String),
    Rename(String, String),
    Truncate(String, u64),
}

/// The outcome of an operation: done, or the errno it failed with.
fn run(op: &Op, root: &Path) -> Result<(), i32> {
    let at = |p: &str| root.join(p);
    let errno = |e: std::io::Error| e.raw_os_error().unwrap_or(-1);
    match op {
        Op::Write { path, seed, len } => {
            fs::write(at(path), stream_bytes(*seed, 0, *len)).map_err(errno)
        }
        Op::Append { path, seed, len } => fs::OpenOptions::new()
            .append(true)
            .open(at(path))
            .and_then(|mut f| f.write_all(&stream_bytes(*seed, 0, *len)))
            .map_err(errno),
        Op::Mkdir(p) => fs::create_dir(at(p)).map_err(errno),
        Op::Rmdir(p) => fs::remove_dir(at(p)).map_err(errno),
        Op::Unlink(p) => fs::remove_file(at(p)).map_err(errno),
        Op::Rename(a, b) => fs::rename(at(a), at(b)).map_err(errno),
        Op::Truncate(p, len) => fs::OpenOptions::new()
            .write(true)
            .open(at(p))
            .and_then(|f| f.set_len(*len))
            .map_err(errno),
    }
}

/// Every entry below `root`: path → `None` for a directory, the bytes for a file.
fn tree(root: &Path) -> BTreeMap<String, Option<Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        let dir = root.join(&rel);
        for e in fs::read_dir(&dir).unwrap_or_else(|e| panic!("list {}: {e}", dir.display())) {
            let e = e.expect("entry");
            let path = rel.join(e.file_name());
            let name = path.to_string_lossy().into_owned();
            if e.file_type().expect("type").is_dir() {
                out.insert(name, None);
                todo.push(path);
            } else {
                let bytes = fs::read(root.join(&path))
                    .unwrap_or_else(|err| panic!("read {name} in {}: {err}", root.display()));
                out.insert(name, Some(bytes));
            }
        }
    }
    out
}

/// What differs between two trees, briefly.
fn differences(
    want: &BTreeMap<String, Option<Vec<u8>>>,
    got: &BTreeMap<String, Option<Vec<u8>>>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (k, v) in want {
        match got.get(k) {
            None => out.push(format!("{k} missing")),
            Some(g) if g != v => out.push(format!(
                "{k} differs ({} vs {} bytes)",
                g.as_ref().map_or(0, Vec::len),
                v.as_ref().map_or(0, Vec::len)
            )),
            Some(_) => {}
        }
    }
    for k in got.keys().filter(|k| !want.contains_key(*k)) {
        out.push(format!("{k} should not be there"));
    }
    out
}

/// A random operation over the names the local tree has (and some it has not).
fn draw(rng: &mut Rng, local: &Path) -> Op {
    let all = tree(local);
    let dirs: Vec<String> = std::iter::once(String::new())
        .chain(
            all.iter()
                .filter(|(_, v)| v.is_none())
                .map(|(k, _)| k.clone()),
        )
        .collect();
    let files: Vec<String> = all
        .iter()
        .filter(|(_, v)| v.is_some())
        .map(|(k, _)| k.clone())
        .collect();
    let pick = |rng: &mut Rng, v: &[String]| v[rng.below(v.len() as u64) as usize].clone();
    let new_name = |rng: &mut Rng| {
        let dir = pick(rng, &dirs);
        let name = format!("n{}", rng.below(40));
        if dir.is_empty() {
            name
        } else {
            format!("{dir}/{name}")
        }
    };
    let some_file = |rng: &mut Rng| {
        if files.is_empty() || rng.below(8) == 0 {
            new_name(rng)
        } else {
            pick(rng, &files)
        }
    };
    let len = |rng: &mut Rng| match rng.below(4) {
        0 => 0,
        1 | 2 => 1 + rng.below(3000) as usize,
        _ => 1 + rng.below(200_000) as usize,
    };
    match rng.below(20) {
        0..=5 => Op::Write {
            path: new_name(rng),
            seed: rng.next_u64(),
            len: len(rng),
        },
        6 | 7 => Op::Append {
            path: some_file(rng),
            seed: rng.next_u64(),
            len: len(rng),
        },
        8 | 9 => Op::Mkdir(new_name(rng)),
        10 => Op::Rmdir(pick(rng, &dirs).max("x".into())),
        11 | 12 => Op::Unlink(some_file(rng)),
        13..=16 => Op::Rename(some_file(rng), new_name(rng)),
        17 => Op::Rename(pick(rng, &dirs).max("x".into()), new_name(rng)),
        _ => Op::Truncate(some_file(rng), rng.below(5000)),
    }
}

#[test]
fn random_operations_on_two_mounts_match_a_local_directory() {
    let c = DevCluster::up_with(3, 143, &["--mount"]);
    for seed in [0x5eed_0037, 0x5eed_0038] {
        let local = tempfile::tempdir().expect("local dir");
        let roots = [
            c.mnt(1).join(format!("diff{seed:x}")),
            c.mnt(2).join(format!("diff{seed:x}")),
        ];
        fs::create_dir(&roots[0]).expect("mkdir on node 1");
        let done = differential(seed, local.path(), &roots);
        assert!(
            done > 150,
            "seed {seed:x}: only {done} of 400 operations succeeded"
        );
    }
}

/// Runs 400 seeded operations; how many succeeded.
fn differential(seed: u64, local: &Path, roots: &[PathBuf; 2]) -> usize {
    let mut rng = Rng(seed);
    let steps = 400;
    let mut node = 0;
    let mut done = 0;
    for step in 0..steps {
        let op = draw(&mut rng, local);
        // Runs of a few steps on one node, then the other: a lease is taken, used and
        // recalled over and over.
        if rng.below(4) == 0 {
            node = 1 - node;
        }
        let want = run(&op, local);
        let got = run(&op, &roots[node]);
        done += usize::from(want.is_ok());
        assert_eq!(
            got,
            want,
            "step {step}: {op:?} on node {} ended otherwise than locally",
            node + 1
        );
        if step % 25 == 24 || step + 1 == steps {
            let want = tree(local);
            for (i, root) in roots.iter().enumerate() {
                let diff = differences(&want, &tree(root));
                assert!(
                    diff.is_empty(),
                    "after step {step} ({op:?}), node {} sees: {diff:?}",
                    i + 1
                );
            }
        }
    }
    done
}
